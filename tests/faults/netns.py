"""Network faults for the fault battery (issue 32): one network namespace per process, each
with its own address 10.78.<net>.<i+1>/24 on a veth pair into a bridge in one more namespace
(as tests/netns/netns_lib.sh builds for the multi-host tests), and packet loss or a full
partition on a namespace's own link by an nftables rule (`numgen random`: each packet is
dropped with the given probability, in both directions). This kernel has no `tc netem`, so
a fixed delay cannot be made; loss and partition can.

Needs root, ip(8) and nft(8) (Debian: iproute2, nftables); CaseSkipped otherwise. Every
namespace is removed by the case's cleanup, whatever happened.
"""

import os
import shutil
import subprocess

from fault_harness import CaseSkipped


def _run(*argv):
    return subprocess.run(list(argv), capture_output=True, text=True)


class Namespaces:
    def __init__(self, job, n):
        if os.geteuid() != 0:
            raise CaseSkipped("network namespaces need root")
        if not shutil.which("ip") or not shutil.which("nft"):
            raise CaseSkipped("no ip(8) or nft(8) (Debian: iproute2, nftables)")
        self.tag = f"gf{os.getpid() % 10000}x{len(job.cleanups)}"
        self.net = os.getpid() % 200 + 20
        self.n = n
        self.names = [f"{self.tag}n{i}" for i in range(n)]
        self.bridge = f"{self.tag}br"
        job.cleanups.append(self.remove)
        if _run("ip", "netns", "add", self.bridge).returncode:
            raise CaseSkipped("cannot create a network namespace")
        if _run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge").returncode:
            raise CaseSkipped("this kernel makes no bridge devices")
        _run("ip", "-n", self.bridge, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names):
            steps = [["ip", "netns", "add", ns],
                     ["ip", "link", "add", f"{self.tag}h{i}", "netns", ns, "type", "veth", "peer", "name", f"p{i}", "netns", self.bridge],
                     ["ip", "-n", ns, "link", "set", "lo", "up"],
                     ["ip", "-n", ns, "link", "set", f"{self.tag}h{i}", "name", "eth0"],
                     ["ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0"],
                     ["ip", "-n", ns, "link", "set", "eth0", "up"],
                     ["ip", "-n", self.bridge, "link", "set", f"p{i}", "master", "br0"],
                     ["ip", "-n", self.bridge, "link", "set", f"p{i}", "up"]]
            for s in steps:
                r = _run(*s)
                if r.returncode:
                    raise CaseSkipped(f"{' '.join(s)}: {r.stderr.strip()}")
            table = ["nft", "add", "table", "inet", "fault"]
            if _run("ip", "netns", "exec", ns, *table).returncode:
                raise CaseSkipped("nft cannot make a table in a namespace (no nf_tables in this kernel?)")
            for hook in ("input", "output"):
                _run("ip", "netns", "exec", ns, "nft", "add", "chain", "inet", "fault", hook,
                     f"{{ type filter hook {hook} priority 0; }}")

    def address(self, i):
        return f"10.78.{self.net}.{i + 1}"

    def argv(self, i, argv):
        """argv run in namespace i (ip netns exec execs it: the PID is the program's own)."""
        return ["ip", "netns", "exec", self.names[i], *argv]

    def drop(self, i, percent):
        """Drops percent % of namespace i's packets on eth0, in and out (100: a partition)."""
        for hook, way in (("input", "iifname"), ("output", "oifname")):
            rule = ([way, "eth0", "drop"] if percent >= 100 else
                    [way, "eth0", "numgen", "random", "mod", "1000", "<", str(int(percent * 10)), "drop"])
            r = _run("ip", "netns", "exec", self.names[i], "nft", "add", "rule", "inet", "fault", hook, *rule)
            if r.returncode:
                raise CaseSkipped(f"nft rule: {r.stderr.strip()}")

    def remove(self):
        for ns in self.names:
            _run("ip", "netns", "del", ns)
        _run("ip", "netns", "del", self.bridge)

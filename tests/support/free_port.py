#!/usr/bin/env python3
"""A loopback TCP port nobody listens on right now, below the kernel's ephemeral range.

The same pick as gradus-run's (tools/gradus-run/ports.hpp says why: a port read back from
bind(0) is handed out again to the next bind(0) or outgoing connection of a process running
beside this one). As a script it
prints one port; the fault harness imports free_port().
"""
import random
import socket


def free_port():
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    first, last = 20000, low - 1
    if last - first < 1000:
        raise RuntimeError("free_port: the ephemeral range starts at %d" % low)
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randint(first, last)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("free_port: no free port in [20000, %d) after 1000 tries" % low)


if __name__ == "__main__":
    print(free_port())

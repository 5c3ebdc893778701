// gradus::ring_allreduce on real networks: where the ranks meet (a host name, "localhost",
// an IPv6 address, this host's own name, a cluster spec naming localhost workers), what rank
// 0 listens on, errors that name the address, the port and the variables they came from,
// and what a neighbour's failure is called: a rank paused for a few seconds is waited for, a
// killed one is "gone" within a second or two, a stopped one is "silent", and the rank that
// sees it writes one line to GRADUS_FAULT_FILE. ipc data sockets leave no files behind.
// Ranks run as forked processes (first: before any ZeroMQ context or thread exists) and as
// threads; every wait is bounded.
#define BOOST_TEST_MODULE dist_ring_network
#include <boost/test/unit_test.hpp>

#include <gradus/comm/ring.hpp>
#include <gradus/parallel/cluster.hpp>

#include "../../support/free_port.hpp"
#include "../../support/rank_harness.hpp"

#include <algorithm>
#include <iterator>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace g = gradus;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace gradus_test;

namespace {

std::string this_host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

// Whether a TCP connection to host:port is accepted within 1 s (host numeric).
bool accepts(const std::string& host, int port) {
  sockaddr_storage a{};
  socklen_t len = 0;
  int family = AF_INET;
  if (host.find(':') != std::string::npos) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET6, host.c_str(), &a6->sin6_addr) != 1) return false;
    len = sizeof *a6;
    family = AF_INET6;
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&a);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<std::uint16_t>(port));
    if (::inet_pton(AF_INET, host.c_str(), &a4->sin_addr) != 1) return false;
    len = sizeof *a4;
  }
  const int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int err = 1;
    socklen_t elen = sizeof err;
    ok = ::poll(&p, 1, 1000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0;
  }
  ::close(fd);
  return ok;
}

// Waits (at most 10 s) until host:port accepts connections.
bool wait_listening(const std::string& host, int port) {
  const auto until = steady::now() + 10s;
  while (steady::now() < until) {
    if (accepts(host, port)) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// Whether this machine has ::1 (a socket can bind it).
bool has_ipv6_loopback() {
  const int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// An IPv4 address of this host that is not a loopback one (an interface that is up), or "".
std::string non_loopback_ipv4() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string out;
  for (auto* p = list; p && out.empty(); p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET || !(p->ifa_flags & IFF_UP) || (p->ifa_flags & IFF_LOOPBACK)) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, buf, sizeof buf);
    out = buf;
  }
  ::freeifaddrs(list);
  return out;
}

void require_no_errors(const std::vector<rank_result>& res) {
  for (std::size_t r = 0; r < res.size(); ++r) BOOST_TEST_REQUIRE(!res[r].error.has_value(), "rank " << r << ": " << *res[r].error);
}

g::ring_options options(int rank, int world, std::string rdv) {
  g::ring_options o;
  o.rank = rank;
  o.world_size = world;
  o.rendezvous = std::move(rdv);
  o.timeout = 20s;
  return o;
}

// `world` ranks meet at `rdv` and all-reduce; returns each rank's data addresses.
std::vector<std::string> meet(int world, const std::string& rdv, const std::string& transport = "tcp") {
  std::vector<std::string> table;
  std::vector<float> sums(world);
  auto res = on_threads(world, [&](int r) {
    auto o = options(r, world, rdv);
    o.transport = transport;
    g::ring_allreduce comm(o);
    std::vector<float> x(1000, static_cast<float>(r + 1));
    comm.allreduce_sum(std::span<float>(x));
    sums[r] = x[999];
    if (r == 0) table = comm.addresses();
  });
  BOOST_TEST_CONTEXT(rdv) {
    require_no_errors(res);
    for (int r = 0; r < world; ++r) BOOST_TEST(sums[r] == world * (world + 1) / 2.f);
  }
  return table;
}

// ---- processes ---------------------------------------------------------------------------

// Pipes between the test and its ranks: each rank writes a byte to `ready` after a few
// collectives; rank 0 reads `stop` (without waiting) and, once a byte is there, tells the
// others through the all-reduced vector itself, so that every rank stops after the same one.
struct loop_pipes {
  int ready[2] = {-1, -1};
  int stop[2] = {-1, -1};
  loop_pipes() {
    if (::pipe(ready) != 0 || ::pipe(stop) != 0) throw std::runtime_error("pipe failed");
    ::fcntl(stop[0], F_SETFL, O_NONBLOCK);
  }
  void parent_side() {
    ::close(ready[1]);
    ::close(stop[0]);
  }
  // Every rank's ready byte (at most 30 s).
  bool wait_ready(int world) const {
    int seen = 0;
    const auto until = steady::now() + 30s;
    while (seen < world && steady::now() < until) {
      pollfd p{ready[0], POLLIN, 0};
      if (::poll(&p, 1, 100) != 1) continue;
      char c;
      const auto got = ::read(ready[0], &c, 1);
      if (got == 1) ++seen;
      else if (got == 0) break;
    }
    return seen == world;
  }
  // False when rank 0 is gone (SIGPIPE is ignored for this).
  bool request_stop() const {
    const char c = 's';
    std::signal(SIGPIPE, SIG_IGN);
    return ::write(stop[1], &c, 1) == 1;
  }
  ~loop_pipes() {
    for (int fd : {ready[0], ready[1], stop[0], stop[1]})
      if (fd >= 0) ::close(fd);
  }
};

// One rank of a process test: all-reduces in a loop until rank 0 is told to stop (exit 0,
// writing "rank<r>.ok" with its longest collective in seconds) or a comm_error (exit 3,
// writing "rank<r>.err": when it was caught (steady_clock ticks), peer, peer_state, what()).
int looping_rank(int r, int world, const std::string& rdv, std::chrono::milliseconds timeout, loop_pipes& pipes, const fs::path& dir) {
  ::close(pipes.ready[0]);
  ::close(pipes.stop[1]);
  auto o = options(r, world, rdv);
  o.transport = "auto";  // shared memory, or the data path GRADUS_COMM_TRANSPORT names (CTest runs each)
  o.timeout = timeout;
  try {
    g::ring_allreduce comm(o);
    std::vector<float> x(1 << 16);  // freed before comm: a failed collective no longer reads it
    double longest = 0;
    const auto until = steady::now() + 90s;
    for (int it = 0; steady::now() < until; ++it) {
      std::fill(x.begin(), x.end(), 1.f);
      x[0] = 0;
      char c;
      if (r == 0 && ::read(pipes.stop[0], &c, 1) == 1) x[0] = 1;
      const auto t = steady::now();
      comm.allreduce_sum(std::span<float>(x));
      longest = std::max(longest, std::chrono::duration<double>(steady::now() - t).count());
      if (x[1] != static_cast<float>(world)) return 5;
      if (it == 3 && ::write(pipes.ready[1], "r", 1) != 1) return 4;
      if (x[0] > 0) {
        std::ofstream(dir / ("rank" + std::to_string(r) + ".ok")) << longest;
        return 0;
      }
    }
    return 6;
  } catch (const g::comm_error& e) {
    const auto at = steady::now().time_since_epoch().count();
    std::ofstream(dir / ("rank" + std::to_string(r) + ".err")) << at << "\n" << e.peer << "\n" << e.peer_state << "\n" << e.what();
    return 3;
  }
}

struct rank_error {
  double after = 0;  // seconds from `since` to the catch
  int peer = -1;
  std::string state, what;
};
rank_error read_error(const fs::path& file, steady::time_point since) {
  std::istringstream in(slurp(file));
  rank_error e;
  long long at = 0;
  in >> at >> e.peer;
  in.ignore(1);
  std::getline(in, e.state);
  std::getline(in, e.what, '\0');
  e.after = std::chrono::duration<double>(steady::duration(at) - since.time_since_epoch()).count();
  return e;
}

// `world` ranks as processes, all-reducing in a loop (looping_rank) over tcp://127.0.0.1
// with GRADUS_FAULT_FILE set, started and waited for until each is through a few
// collectives (at most 30 s).
struct loop_job {
  temp_dir dir;
  loop_pipes pipes;
  std::vector<child> kids;
  bool ready = false;
  loop_job(int world, std::chrono::milliseconds timeout) {
    const std::string rdv = "tcp://127.0.0.1:" + std::to_string(free_port());
    const std::string faults = this->faults().string();
    kids = fork_ranks(world, [&](int r) {
      ::setenv("GRADUS_FAULT_FILE", faults.c_str(), 1);
      return looping_rank(r, world, rdv, timeout, pipes, dir.path);
    });
    pipes.parent_side();
    ready = pipes.wait_ready(world);
    std::this_thread::sleep_for(200ms);  // well into the loop
  }
  fs::path faults() const { return dir.path / "faults"; }
  rank_error error_of(int r, steady::time_point since) const { return read_error(dir.path / ("rank" + std::to_string(r) + ".err"), since); }
};

// The fault file of a job in which rank 1 of 3 failed: one line per rank that saw it
// itself (rank 2, its right neighbour, always; rank 0 when it was sending to rank 1), each
// blaming rank 1 as `state`; none from a rank that only got the abort.
void check_fault_lines(const fs::path& file, const std::string& state) {
  const std::string text = slurp(file);
  std::vector<std::string> lines;
  for (std::size_t b = 0, nl; b < text.size(); b = nl + 1) {
    nl = text.find('\n', b);
    if (nl == std::string::npos) nl = text.size();  // a last line without its newline fails the match below
    lines.push_back(text.substr(b, nl - b) + (nl == text.size() ? "<no newline>" : ""));
  }
  BOOST_TEST(!lines.empty());
  BOOST_TEST(lines.size() <= 2u);
  const std::regex line_re("rank ([02]) blames rank 1 \\(" + state + "\\): gradus: ring_allreduce: allreduce_sum #[0-9]+ .* on rank \\1: .*" + state + ".*");
  bool from_rank2 = false;
  for (const auto& l : lines) {
    std::smatch m;
    BOOST_TEST(std::regex_match(l, m, line_re), "fault line: " << l);
    if (!m.empty() && m[1] == "2") from_rank2 = true;
  }
  BOOST_TEST(from_rank2, text);
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_paused_rank_is_not_a_dead_rank) {
  // Rank 1 is stopped (SIGSTOP) for 4 s in the middle of the loop, then continued: with a
  // 20 s timeout the others wait for it, and every collective completes.
  const int world = 3;
  loop_job job(world, 20s);
  if (job.ready) {
    ::kill(job.kids[1].pid, SIGSTOP);
    std::this_thread::sleep_for(4s);
    ::kill(job.kids[1].pid, SIGCONT);
    std::this_thread::sleep_for(500ms);
    (void)job.pipes.request_stop();
  }
  const auto st = reap(job.kids, 40s);
  BOOST_TEST_REQUIRE(job.ready, "the ranks did not all start");
  for (int r = 0; r < world; ++r) {
    const fs::path err = job.dir.path / ("rank" + std::to_string(r) + ".err");
    BOOST_TEST(st[r].status == 0, "rank " << r << " exited with " << st[r].status << (fs::exists(err) ? ": " + slurp(err) : std::string()));
  }
  std::istringstream in(slurp(job.dir.path / "rank0.ok"));
  double longest = 0;
  in >> longest;
  BOOST_TEST(longest >= 3.5, "rank 0's longest collective took " << longest << " s: the pause did not fall into one");
  BOOST_TEST(!fs::exists(job.faults()), "a fault was written: " << slurp(job.faults()));
  BOOST_TEST_MESSAGE("paused rank: rank 0's longest collective " << longest << " s, and every rank finished");
}

BOOST_AUTO_TEST_CASE(a_killed_rank_is_gone_within_2s_and_blamed_in_the_fault_file) {
  loop_job job(3, 30s);
  ::kill(job.kids[1].pid, SIGKILL);
  const auto killed_at = steady::now();
  const auto st = reap(job.kids, 30s);
  BOOST_TEST_REQUIRE(job.ready, "the ranks did not all start");
  BOOST_TEST(st[1].status == -SIGKILL);
  for (int r : {0, 2}) {
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST_REQUIRE(st[r].status == 3, "exited with " << st[r].status);
      const auto e = job.error_of(r, killed_at);
      BOOST_TEST_MESSAGE("killed rank: rank " << r << " failed " << e.after << " s after the kill: " << e.what);
      BOOST_TEST(e.after < 2.0);
      BOOST_TEST(contains(e.what, "rank 1"), e.what);
      BOOST_TEST(contains(e.what, "gone"), e.what);
      if (r == 2) {  // its left neighbour died: it saw the connection close itself
        BOOST_TEST(e.peer == 1);
        BOOST_TEST(e.state == "gone");
      }
    }
  }
  check_fault_lines(job.faults(), "gone");
}

BOOST_AUTO_TEST_CASE(a_stopped_rank_is_silent_and_blamed_by_its_neighbour) {
  // Rank 1 stops for good: its neighbours' heartbeats drop it after timeout - 2 s = 6 s, and
  // its process still listens, so it is "silent" (not gone), blamed before the 8 s waits
  // of the ranks further away expire (each would blame its own waiting neighbour).
  loop_job job(3, 8s);
  ::kill(job.kids[1].pid, SIGSTOP);
  const auto stopped_at = steady::now();
  const auto st = reap(job.kids, {0, 2}, 30s);
  ::kill(job.kids[1].pid, SIGKILL);
  (void)reap(job.kids, {1}, 10s);
  BOOST_TEST_REQUIRE(job.ready, "the ranks did not all start");
  for (int r : {0, 2}) {
    BOOST_TEST_CONTEXT("rank " << r) {
      BOOST_TEST_REQUIRE(st[r].status == 3, "exited with " << st[r].status);
      const auto e = job.error_of(r, stopped_at);
      BOOST_TEST_MESSAGE("stopped rank: rank " << r << " failed " << e.after << " s after the stop: " << e.what);
      BOOST_TEST(contains(e.what, "rank 1"), e.what);
      BOOST_TEST(contains(e.what, "silent"), e.what);
      BOOST_TEST(!contains(e.what, "gone"), e.what);
      if (r == 2) {
        BOOST_TEST(e.peer == 1);
        BOOST_TEST(e.state == "silent");
        BOOST_TEST(e.after >= 5.5);  // not before the heartbeat timeout
        BOOST_TEST(e.after < 8.0);   // before its own wait runs out
      }
    }
  }
  check_fault_lines(job.faults(), "silent");
}

BOOST_AUTO_TEST_CASE(killed_ranks_leave_no_socket_files_or_shared_memory) {
  // auto on one host picks shared memory (and ipc for ZeroMQ's control sockets); a rank
  // killed with SIGKILL cannot unlink anything, so neither its sockets nor its segments may
  // have names: Linux abstract sockets (ipc://@..., shm://@...) and memfd segments, nothing
  // in /tmp or /dev/shm.
  auto shm_entries = [] {
    std::vector<std::string> names;
    if (fs::exists("/dev/shm"))
      for (const auto& e : fs::directory_iterator("/dev/shm")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto shm_before = shm_entries();
  const int world = 2;
  temp_dir dir;
  loop_pipes pipes;
  const std::string rdv = "tcp://127.0.0.1:" + std::to_string(free_port());
  auto kids = fork_ranks(world, [&](int r) {
    ::close(pipes.ready[0]);
    ::close(pipes.stop[1]);
    auto o = options(r, world, rdv);
    g::ring_allreduce comm(o);  // transport auto
    comm.barrier();
    std::ofstream(dir.path / ("rank" + std::to_string(r))) << comm.transport() << " " << comm.addresses().at(r);
    if (::write(pipes.ready[1], "r", 1) != 1) return 4;
    for (int i = 0; i < 300; ++i) std::this_thread::sleep_for(100ms);  // until killed (bounded: 30 s)
    return 0;
  });
  pipes.parent_side();
  const bool ready = pipes.wait_ready(world);
  for (const auto& k : kids) ::kill(k.pid, SIGKILL);
  (void)reap(kids, 10s);
  BOOST_TEST_REQUIRE(ready);
  for (int r = 0; r < world; ++r) {
    std::istringstream in(slurp(dir.path / ("rank" + std::to_string(r))));
    std::string transport, address;
    in >> transport >> address;
    BOOST_TEST(transport == gradus_test::auto_transport_on_one_host());
    BOOST_TEST(address.rfind(gradus_test::auto_address_prefix(), 0) == 0u, address);
  }
  for (const auto& entry : fs::directory_iterator(fs::temp_directory_path())) {
    const std::string name = entry.path().filename().string();
    for (const auto& k : kids)
      BOOST_TEST(!contains(name, "gradus-ring-" + std::to_string(k.pid) + "-"), "left behind: " << entry.path());
  }
  const auto shm_after = shm_entries();
  std::vector<std::string> added;
  std::set_difference(shm_after.begin(), shm_after.end(), shm_before.begin(), shm_before.end(), std::back_inserter(added));
  for (const auto& name : added) {
    BOOST_TEST(!contains(name, "gradus"), "left behind in /dev/shm: " << name);
    // LLVM's OpenMP runtime (clang builds) registers every process as
    // /dev/shm/__KMP_REGISTERED_LIB_<pid>_<uid>, which a SIGKILLed process cannot remove:
    // not gradus', but this test made them, so it removes its ranks' ones.
    for (const auto& k : kids)
      if (name.rfind("__KMP_REGISTERED_LIB_" + std::to_string(k.pid) + "_", 0) == 0) {
        std::error_code ec;
        fs::remove(fs::path("/dev/shm") / name, ec);
      }
  }
}

// ---- threads -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(ranks_meet_at_localhost) {
  const int port = free_port();
  const auto table = meet(3, "tcp://localhost:" + std::to_string(port));
  // Data addresses are numeric (no rank depends on how another resolves a name).
  for (const auto& a : table) BOOST_TEST((a.rfind("tcp://127.0.0.1:", 0) == 0 || a.rfind("tcp://[::1]:", 0) == 0), a);
  // and with the default transport: shared memory between ranks on one host
  const auto local = meet(2, "tcp://localhost:" + std::to_string(free_port()), "auto");
  for (const auto& a : local) BOOST_TEST(a.rfind(gradus_test::auto_address_prefix(), 0) == 0u, a);
  // ZeroMQ's own tcp sockets choose their addresses the same way
  for (const auto& a : meet(2, "tcp://localhost:" + std::to_string(free_port()), "zmq-tcp"))
    BOOST_TEST((a.rfind("tcp://127.0.0.1:", 0) == 0 || a.rfind("tcp://[::1]:", 0) == 0), a);
}

BOOST_AUTO_TEST_CASE(ranks_meet_at_the_ipv6_loopback) {
  if (!has_ipv6_loopback()) {
    BOOST_TEST_MESSAGE("skipped: this machine has no ::1");
    return;
  }
  const auto table = meet(3, "tcp://[::1]:" + std::to_string(free_port()));
  for (const auto& a : table) BOOST_TEST(a.rfind("tcp://[::1]:", 0) == 0u, a);
}

BOOST_AUTO_TEST_CASE(ranks_meet_at_this_hosts_name_and_rank_0_listens_everywhere) {
  // Debian resolves the host's own name to 127.0.1.1 (here: whatever /etc/hosts says), which
  // other hosts do not dial: rank 0 listens on every interface, IPv4 and IPv6.
  const std::string host = this_host();
  const int port = free_port();
  const std::string rdv = "tcp://" + host + ":" + std::to_string(port);
  std::optional<std::string> err0;
  std::thread rank0([&] {
    try {
      auto o = options(0, 2, rdv);
      o.transport = "tcp";
      g::ring_allreduce comm(o);
      comm.barrier();
    } catch (const std::exception& e) {
      err0 = e.what();
    }
  });
  const bool v4 = wait_listening("127.0.0.1", port);
  const bool v6 = has_ipv6_loopback() ? accepts("::1", port) : true;
  const std::string lan = non_loopback_ipv4();
  const bool on_lan = lan.empty() || accepts(lan, port);
  std::optional<std::string> err1;
  try {
    auto o = options(1, 2, rdv);
    o.transport = "tcp";
    g::ring_allreduce comm(o);
    comm.barrier();
  } catch (const std::exception& e) {
    err1 = e.what();
  }
  rank0.join();
  BOOST_TEST(!err0.has_value(), *err0);
  BOOST_TEST(!err1.has_value(), *err1);
  BOOST_TEST(v4, "rank 0 does not listen on 127.0.0.1:" << port);
  BOOST_TEST(v6, "rank 0 does not listen on [::1]:" << port);
  BOOST_TEST(on_lan, "rank 0 does not listen on " << lan << ":" << port);
}

BOOST_AUTO_TEST_CASE(localhost_listens_on_loopback_only_and_bind_host_overrides) {
  const std::string lan = non_loopback_ipv4();
  // "localhost": loopback addresses only
  {
    const int port = free_port();
    std::optional<std::string> err;
    std::thread rank0([&] {
      try {
        auto o = options(0, 2, "tcp://localhost:" + std::to_string(port));
        o.timeout = o.rendezvous_timeout = 3s;
        g::ring_allreduce comm(o);
      } catch (const std::exception& e) {
        err = e.what();
      }
    });
    const bool loop = wait_listening("127.0.0.1", port);
    const bool on_lan = !lan.empty() && accepts(lan, port);
    rank0.join();  // rank 1 never comes: rank 0 gives up after 3 s
    BOOST_TEST(loop);
    BOOST_TEST(!on_lan, "rank 0 listens on " << lan << ":" << port << " for a localhost rendezvous");
    BOOST_TEST_REQUIRE(err.has_value());
    BOOST_TEST(contains(*err, "rank 1 of world_size 2 did not register within 3000 ms"), *err);
    BOOST_TEST(contains(*err, "from ring_options::rendezvous"), *err);
  }
  // this host's name, but bind_host = 127.0.0.1: that interface only
  {
    const int port = free_port();
    const std::string rdv = "tcp://" + this_host() + ":" + std::to_string(port);
    std::optional<std::string> err0;
    std::vector<std::string> table;
    std::thread rank0([&] {
      try {
        auto o = options(0, 2, rdv);
        o.transport = "tcp";
        o.bind_host = "127.0.0.1";
        g::ring_allreduce comm(o);
        table = comm.addresses();
      } catch (const std::exception& e) {
        err0 = e.what();
      }
    });
    const bool loop = wait_listening("127.0.0.1", port);
    const bool v6 = has_ipv6_loopback() && accepts("::1", port);
    const bool on_lan = !lan.empty() && accepts(lan, port);
    std::optional<std::string> err1;
    try {
      auto o = options(1, 2, rdv);
      o.transport = "tcp";
      g::ring_allreduce comm(o);
    } catch (const std::exception& e) {
      err1 = e.what();
    }
    rank0.join();
    BOOST_TEST(!err0.has_value(), *err0);
    BOOST_TEST(!err1.has_value(), *err1);
    BOOST_TEST(loop);
    BOOST_TEST(!v6, "bind_host 127.0.0.1, yet rank 0 listens on [::1]");
    BOOST_TEST(!on_lan, "bind_host 127.0.0.1, yet rank 0 listens on " << lan);
    BOOST_TEST_REQUIRE(table.size() == 2u);
    BOOST_TEST(table[0].rfind("tcp://127.0.0.1:", 0) == 0u, table[0]);
  }
}

BOOST_AUTO_TEST_CASE(an_occupied_port_is_named_with_where_it_came_from) {
  // Someone else listens on 127.0.0.1:port.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  BOOST_TEST_REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  BOOST_TEST_REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  BOOST_TEST_REQUIRE(::listen(fd, 4) == 0);
  BOOST_TEST_REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  const std::string port = std::to_string(ntohs(a.sin_port));

  auto rank0_error = [&](g::ring_options o) -> std::string {
    try {
      g::ring_allreduce comm(o);
    } catch (const g::comm_error& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("not a comm_error: ") + e.what();
    }
    return "no error";
  };
  // from a cluster spec, as torchrun describes it
  const auto spec = g::cluster::from_env(std::map<std::string, std::string>{
      {"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "localhost"}, {"MASTER_PORT", port}});
  auto o = options(0, 2, spec.rendezvous());
  o.origin = spec.rendezvous_origin();
  o.timeout = 2s;
  std::string msg = rank0_error(o);
  BOOST_TEST(contains(msg, "gradus: ring_allreduce: rank 0 cannot listen on 127.0.0.1:" + port + " (the rendezvous, from MASTER_ADDR=localhost and MASTER_PORT=" +
                               port + " (torchrun)): Address already in use"),
             msg);
  BOOST_TEST(contains(msg, "another job on this port? pick another MASTER_PORT"), msg);
  // from the options alone
  o.origin.clear();
  msg = rank0_error(o);
  BOOST_TEST(contains(msg, "rank 0 cannot listen on 127.0.0.1:" + port + " (the rendezvous, from ring_options::rendezvous): Address already in use"), msg);
  BOOST_TEST(contains(msg, "pick another port"), msg);
  // every interface, for this host's name
  o.rendezvous = "tcp://" + this_host() + ":" + port;
  msg = rank0_error(o);
  BOOST_TEST(contains(msg, "rank 0 cannot listen on *:" + port + " (every interface) (the rendezvous"), msg);
  ::close(fd);
}

BOOST_AUTO_TEST_CASE(names_that_do_not_resolve_or_answer_are_named) {
  const std::string rdv = "tcp://no-such-host.invalid:" + std::to_string(free_port());
  for (int r : {0, 1}) {
    std::string msg = "no error";
    try {
      auto o = options(r, 2, rdv);
      o.timeout = o.rendezvous_timeout = 1s;
      o.origin = "MASTER_ADDR=no-such-host.invalid and MASTER_PORT=1 (torchrun)";
      g::ring_allreduce comm(o);
    } catch (const g::comm_error& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      msg = std::string("not a comm_error: ") + e.what();
    }
    BOOST_TEST(contains(msg, "rank " + std::to_string(r) + " cannot resolve 'no-such-host.invalid' (the rendezvous, from MASTER_ADDR=no-such-host.invalid"), msg);
    // asked again until the timeout (a name may be published late), not once: 0.1 + 0.2 +
    // 0.4 s of pauses fit in 1 s, so at least 4 tries
    BOOST_TEST(contains(msg, " times over "), msg);
    const auto at = msg.find("(asked ");
    BOOST_TEST_REQUIRE(at != std::string::npos, msg);
    BOOST_TEST(std::stoi(msg.substr(at + 7)) >= 4, msg);
  }
  // A name that resolves, but nobody listens there: the error says which address was dialled.
  const std::string port = std::to_string(free_port());
  std::string msg = "no error";
  try {
    auto o = options(1, 2, "tcp://localhost:" + port);
    o.timeout = o.rendezvous_timeout = 300ms;
    g::ring_allreduce comm(o);
  } catch (const g::comm_error& e) {
    msg = e.what();
  }
  BOOST_TEST(std::regex_search(msg, std::regex("no answer from rank 0 at tcp://(127\\.0\\.0\\.1|\\[::1\\]):" + port + " \\(localhost resolved to ")), msg);
}

BOOST_AUTO_TEST_CASE(a_tf_config_cluster_of_localhost_workers_trains) {
  const std::string p = std::to_string(free_port()), q = std::to_string(free_port());
  std::vector<std::string> origins(2);
  auto res = on_threads(2, [&](int r) {
    const auto spec = g::cluster::from_env(std::map<std::string, std::string>{
        {"TF_CONFIG", R"({"cluster": {"worker": ["localhost:)" + p + R"(", "localhost:)" + q + R"("]}, "task": {"type": "worker", "index": )" +
                          std::to_string(r) + "}}"}});
    origins[r] = spec.rendezvous_origin();
    g::ring_options base;
    base.timeout = 20s;
    base.transport = "tcp";
    base.origin = spec.rendezvous_origin();
    g::ring_allreduce comm(spec, base);
    std::vector<double> x(10, r + 1.0);
    comm.allreduce_sum(std::span<double>(x));
    if (x[9] != 3.0) throw std::runtime_error("wrong sum");
  });
  require_no_errors(res);
  BOOST_TEST(origins[1] == "TF_CONFIG cluster.worker[0] = localhost:" + p);
}

BOOST_AUTO_TEST_CASE(an_ipc_path_rendezvous_still_unlinks_its_files) {
  temp_dir dir;
  const std::string rdv = "ipc://" + (dir.path / "rdv").string();
  auto res = on_threads(2, [&](int r) {
    auto o = options(r, 2, rdv);
    o.transport = "zmq";  // ZeroMQ's data sockets: ipc, beside the rendezvous' path
    g::ring_allreduce comm(o);
    if (comm.addresses().at(r) != rdv + ".rank" + std::to_string(r)) throw std::runtime_error("address " + comm.addresses().at(r));
    comm.barrier();
  });
  require_no_errors(res);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir.path)) left.push_back(e.path().filename().string());
  BOOST_TEST(left.empty(), "left behind: " << (left.empty() ? "" : left.front()));
}

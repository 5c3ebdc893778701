// gradus::ring_allreduce's point-to-point (send / recv between any two ranks, both
// directions) and sub-groups (split): every ordered pair of 2, 3 and 4 ranks (itself
// included) exchanges 0, 1, 7, 1000 and 2^20 floats, doubles and bytes, checked bit for bit,
// over inproc:// (ranks as threads) and forked processes over ipc:// and tcp://127.0.0.1;
// per-source order, messages of other sources queued while a recv waits, sends and recvs
// between collectives; probe before and after a message arrives; a recv of the wrong size
// or dtype names the peer and both sizes; a SIGKILLed peer fails a waiting recv within
// seconds, naming it. split({0, 2}, {1, 3}) and
// others: the sub-groups' allreduce, broadcast, allgather and barrier against references
// computed here, the same bits on every member, point-to-point inside a group. Every wait
// is bounded (the communicator's timeout, reap's limit). About 640 lines: one header pair's
// tests (point-to-point and the sub-groups built on it), sharing their rank harness.
#define BOOST_TEST_MODULE ring_point_to_point
#include <boost/test/unit_test.hpp>

#include <gradus/comm/ring.hpp>
#include <gradus/parallel/any_collectives.hpp>
#include <gradus/parallel/any_point_to_point.hpp>

#include "../../support/free_port.hpp"
#include "../../support/rank_harness.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

namespace g = gradus;
using namespace std::chrono_literals;

namespace {

using gradus_test::contains;
using gradus_test::fork_ranks;
using gradus_test::free_port;
using gradus_test::on_threads;
using gradus_test::rank_result;
using gradus_test::reap;
using gradus_test::slurp;
using gradus_test::temp_dir;
using steady = std::chrono::steady_clock;

g::ring_options options(int rank, int world, std::string rdv, zmq::context_t* ctx = nullptr) {
  g::ring_options o;
  o.rank = rank;
  o.world_size = world;
  o.rendezvous = std::move(rdv);
  o.context = ctx;
  o.timeout = 20s;
  return o;
}

void require_no_errors(const std::vector<rank_result>& res) {
  for (std::size_t r = 0; r < res.size(); ++r) BOOST_TEST_REQUIRE(!res[r].error.has_value(), "rank " << r << ": " << *res[r].error);
}

// Element i of message k from rank `from` to rank `to`: different per message and element,
// finite, not small integers.
template <class T>
T value(int from, int to, std::size_t k, std::size_t i) {
  std::uint64_t z = (static_cast<std::uint64_t>(from) * 131 + static_cast<std::uint64_t>(to) * 17 + k + 1) * 0x9E3779B97F4A7C15ull +
                    i * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 31;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 29;
  if constexpr (std::is_same_v<T, std::byte>) return static_cast<std::byte>(z & 0xff);
  else return static_cast<T>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * T(3.7);
}
template <class T>
std::vector<T> message(int from, int to, std::size_t k, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(from, to, k, i);
  return v;
}
template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else return "byte";
}

const std::size_t sizes[] = {0, 1, 7, 1000, std::size_t{1} << 20};

template <class T, class C>
void send_one(C& comm, int to, std::size_t k, std::size_t n) {
  const auto x = message<T>(comm.rank(), to, k, n);
  comm.send(std::span<const T>(x), to);
}
template <class T, class C>
void expect_one(C& comm, int from, std::size_t k, std::size_t n) {
  std::vector<T> got(n);
  comm.recv(std::span<T>(got), from);
  const auto want = message<T>(from, comm.rank(), k, n);
  if (n && std::memcmp(got.data(), want.data(), n * sizeof(T)) != 0)
    throw std::runtime_error("rank " + std::to_string(comm.rank()) + ": message " + std::to_string(k) + " from rank " + std::to_string(from) +
                             " (" + std::to_string(n) + " " + type_name<T>() + ") differs");
}

// Every rank sends every size and dtype to every rank (itself included), then receives from
// each in reverse rank order: meanwhile the other sources' messages queue.
template <class C>
void exchange_all_pairs(C& comm) {
  const int N = comm.world_size();
  for (int to = 0; to < N; ++to) {
    std::size_t k = 0;
    for (std::size_t n : sizes) {
      send_one<float>(comm, to, k++, n);
      send_one<double>(comm, to, k++, n);
      send_one<std::byte>(comm, to, k++, n);
    }
  }
  for (int from = N - 1; from >= 0; --from) {
    std::size_t k = 0;
    for (std::size_t n : sizes) {
      expect_one<float>(comm, from, k++, n);
      expect_one<double>(comm, from, k++, n);
      expect_one<std::byte>(comm, from, k++, n);
    }
  }
}

// Runs body(comm) on `world` forked ranks over "ipc" (an ipc:// rendezvous: the ring's data
// path is auto's, the mesh ipc) or "tcp" (tcp://127.0.0.1, transport zmq-tcp: the mesh on
// loopback tcp). Returns each rank's error text ("" when it exited 0).
std::vector<std::string> on_processes(int world, const std::string& scheme, const std::function<void(g::ring_allreduce&)>& body) {
  temp_dir dir;
  const std::string rdv = scheme == "tcp" ? "tcp://127.0.0.1:" + std::to_string(free_port()) : dir.ipc("rdv");
  auto kids = fork_ranks(world, [&](int r) {
    try {
      auto o = options(r, world, rdv);
      if (scheme == "tcp") o.transport = "zmq-tcp";
      g::ring_allreduce comm(o);
      if (scheme == "tcp" && comm.transport() != "zmq-tcp") throw std::runtime_error("transport " + comm.transport());
      body(comm);
      return 0;
    } catch (const std::exception& e) {
      std::ofstream(dir.path / ("rank" + std::to_string(r) + ".err")) << e.what();
      return 3;
    }
  });
  const auto st = reap(kids, 60s);
  std::vector<std::string> out(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    if (st[r].status != 0)
      out[r] = "exit " + std::to_string(st[r].status) + ": " + slurp(dir.path / ("rank" + std::to_string(r) + ".err"));
  return out;
}

void require_clean(const std::vector<std::string>& errs) {
  for (std::size_t r = 0; r < errs.size(); ++r) BOOST_TEST(errs[r].empty(), "rank " << r << ": " << errs[r]);
}

// ---- sub-groups: what each member computes, checked here against references ------------

// Element i of rank r's contribution: integers (sums exact in any order) or not.
template <class T>
T contribution(int rank, std::size_t i, bool integers) {
  return integers ? static_cast<T>(rank * 1000 + static_cast<int>(i % 997) - 1500) : value<T>(rank, 99, 7, i);
}
template <class T>
std::vector<T> contribution(int rank, std::size_t n, bool integers, std::size_t) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = contribution<T>(rank, i, integers);
  return v;
}

std::uint64_t checksum(const void* p, std::size_t bytes) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

// One member's run through every collective of its group `sg` (members given as ranks of the
// whole communicator); throws on a wrong result. Returns a checksum of its non-integer
// all-reduce results, to compare across members.
template <class G>
std::uint64_t exercise_group(G& sg, const std::vector<int>& members, int world_rank) {
  const int N = sg.world_size(), me = sg.rank();
  if (sg.members() != members) throw std::runtime_error("members differ");
  if (members[static_cast<std::size_t>(me)] != world_rank) throw std::runtime_error("wrong group rank");
  auto fail = [&](const std::string& what) { throw std::runtime_error("rank " + std::to_string(world_rank) + ": " + what); };
  std::uint64_t sum = 0;
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{1001}, std::size_t{300007}}) {
    // exact: integers
    auto x = contribution<float>(world_rank, n, true, 0);
    sg.allreduce_sum(std::span<float>(x));
    for (std::size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int q : members) want += contribution<float>(q, i, true);
      if (x[i] != want) fail("allreduce_sum element " + std::to_string(i) + " of " + std::to_string(n));
    }
    // not exact: close to a sum in double, and the same bits on every member (compared by the caller)
    auto d = contribution<double>(world_rank, n, false, 0);
    sg.allreduce_average(std::span<double>(d));
    for (std::size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int q : members) want += contribution<double>(q, i, false);
      want /= N;
      if (std::abs(d[i] - want) > 1e-14) fail("allreduce_average element " + std::to_string(i));
    }
    auto f = contribution<float>(world_rank, n, false, 0);
    sg.allreduce_sum(std::span<float>(f));
    sum ^= checksum(d.data(), d.size() * sizeof(double)) * 3 + checksum(f.data(), f.size() * sizeof(float));
  }
  // broadcast from every group root, of each dtype
  for (int root = 0; root < N; ++root) {
    auto b = message<double>(world_rank, 0, 1, 100003);
    sg.broadcast(std::span<double>(b), root);
    if (b != message<double>(members[static_cast<std::size_t>(root)], 0, 1, 100003)) fail("broadcast (double) from " + std::to_string(root));
    auto c = message<std::byte>(world_rank, 0, 2, 33);
    sg.broadcast(std::span<std::byte>(c), root);
    if (c != message<std::byte>(members[static_cast<std::size_t>(root)], 0, 2, 33)) fail("broadcast (bytes) from " + std::to_string(root));
    std::vector<float> e;
    sg.broadcast(std::span<float>(e), root);
  }
  // allgather: every member's block, in group-rank order
  for (std::size_t m : {std::size_t{0}, std::size_t{3}, std::size_t{70001}}) {
    const auto mine = message<float>(world_rank, 1, 3, m);
    std::vector<float> all(m * static_cast<std::size_t>(N), -1.f);
    sg.allgather(std::span<const float>(mine), std::span<float>(all));
    for (int q = 0; q < N; ++q) {
      const auto want = message<float>(members[static_cast<std::size_t>(q)], 1, 3, m);
      if (!std::equal(want.begin(), want.end(), all.begin() + static_cast<std::ptrdiff_t>(m * static_cast<std::size_t>(q))))
        fail("allgather block " + std::to_string(q));
    }
  }
  sg.barrier();
  // point-to-point between group ranks: around the group, both ways
  const int right = (me + 1) % N, left = (me + N - 1) % N;
  for (std::size_t n : {std::size_t{0}, std::size_t{7}, std::size_t{200000}}) {
    send_one<float>(sg, right, 5, n);
    send_one<double>(sg, left, 6, n);
    expect_one<float>(sg, left, 5, n);
    expect_one<double>(sg, right, 6, n);
  }
  sg.barrier();
  return sum;
}

}  // namespace

// ---- processes (first: fork before any ZeroMQ context or thread exists) ------------------

BOOST_AUTO_TEST_CASE(every_pair_exchanges_every_size_over_ipc_and_tcp_processes) {
  for (std::string scheme : {"ipc", "tcp"})
    for (int world : {2, 3, 4}) {
      BOOST_TEST_CONTEXT(scheme << ", " << world << " processes") {
        require_clean(on_processes(world, scheme, [](g::ring_allreduce& comm) {
          exchange_all_pairs(comm);
          // and the ring still works after (and between) them
          std::vector<float> x(1000, 1.f);
          comm.allreduce_sum(std::span<float>(x));
          if (x[999] != static_cast<float>(comm.world_size())) throw std::runtime_error("allreduce after point-to-point");
          exchange_all_pairs(comm);
          // ranks on one host: every pair's messages went through shared memory
          for (int p = 0; p < comm.world_size(); ++p)
            if (p != comm.rank() && comm.point_to_point_path(p) != "shared memory")
              throw std::runtime_error("rank " + std::to_string(comm.rank()) + " sent to rank " + std::to_string(p) + " by " +
                                       comm.point_to_point_path(p));
          comm.barrier();
        }));
      }
    }
}

// Both directions at once, messages larger than a shared-memory segment (8 MiB: they stream
// through it while the receiver copies out) and than the size ZeroMQ sends zero-copy: over
// shared memory, and over ZeroMQ with GRADUS_P2P_SHM=0.
BOOST_AUTO_TEST_CASE(large_messages_cross_both_ways_over_shared_memory_and_zeromq) {
  for (const char* shm : {"1", "0"})
    BOOST_TEST_CONTEXT("GRADUS_P2P_SHM=" << shm) {
      ::setenv("GRADUS_P2P_SHM", shm, 1);
      require_clean(on_processes(2, "ipc", [&](g::ring_allreduce& comm) {
        const int peer = 1 - comm.rank();
        constexpr std::size_t n = std::size_t{3} << 20;  // 12 MiB of floats
        for (std::size_t k = 0; k < 3; ++k) {
          send_one<float>(comm, peer, k, n);
          send_one<float>(comm, peer, k + 10, 5);  // a small one right behind: order kept
        }
        for (std::size_t k = 0; k < 3; ++k) {
          expect_one<float>(comm, peer, k, n);
          expect_one<float>(comm, peer, k + 10, 5);
        }
        const std::string want = std::string(shm) == "1" ? "shared memory" : "zeromq";
        if (comm.point_to_point_path(peer) != want)
          throw std::runtime_error("sent by " + comm.point_to_point_path(peer) + ", not " + want);
      }));
      ::unsetenv("GRADUS_P2P_SHM");
    }
}

// probe(from): false before anything was sent, true once a message has arrived (within a
// bounded wait), false again once every message was received; through shared memory and
// ZeroMQ, on the communicator and in a sub-group of it.
BOOST_AUTO_TEST_CASE(probe_says_whether_a_message_has_arrived) {
  const auto until = [](auto&& here) {
    const auto deadline = steady::now() + 10s;
    while (!here()) {
      if (steady::now() > deadline) throw std::runtime_error("probe never saw the message arrive (10 s)");
      std::this_thread::sleep_for(1ms);
    }
  };
  for (const char* shm : {"1", "0"})
    BOOST_TEST_CONTEXT("GRADUS_P2P_SHM=" << shm) {
      ::setenv("GRADUS_P2P_SHM", shm, 1);
      require_clean(on_processes(2, "ipc", [&](g::ring_allreduce& comm) {
        auto group = comm.split(0, comm.rank());
        comm.barrier();
        if (comm.rank() == 1 && (comm.probe(0) || group.probe(0))) throw std::runtime_error("probe true before any send");
        comm.barrier();
        if (comm.rank() == 0) {
          send_one<float>(comm, 1, 1, 1000);
          send_one<float>(comm, 1, 2, 5);
          group.send(std::span<const double>(std::vector<double>{4.5}), 1);
        } else {
          until([&] { return comm.probe(0); });
          expect_one<float>(comm, 0, 1, 1000);
          until([&] { return comm.probe(0); });
          expect_one<float>(comm, 0, 2, 5);
          until([&] { return group.probe(0); });
          if (comm.probe(0)) throw std::runtime_error("probe true with the communicator's messages all received");
          std::vector<double> v(1);
          group.recv(std::span<double>(v), 0);
          if (v[0] != 4.5 || group.probe(0)) throw std::runtime_error("the sub-group's message, or probe after it");
        }
        comm.barrier();
      }));
      ::unsetenv("GRADUS_P2P_SHM");
    }
}

BOOST_AUTO_TEST_CASE(sub_groups_over_ipc_and_tcp_processes) {
  for (std::string scheme : {"ipc", "tcp"}) {
    BOOST_TEST_CONTEXT(scheme) {
      temp_dir out;
      require_clean(on_processes(4, scheme, [&](g::ring_allreduce& comm) {
        const int r = comm.rank();
        auto sg = comm.split(r % 2, r);  // {0, 2} and {1, 3}
        const auto sum = exercise_group(sg, r % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2}, r);
        std::ofstream(out.path / ("sum" + std::to_string(r))) << sum;
      }));
      BOOST_TEST(slurp(out.path / "sum0") == slurp(out.path / "sum2"), "the members of {0, 2} differ in bits");
      BOOST_TEST(slurp(out.path / "sum1") == slurp(out.path / "sum3"), "the members of {1, 3} differ in bits");
    }
  }
}

namespace {

// Three processes; the parent SIGKILLs rank 2 while rank 1 waits in a recv from it (after
// an exchange, so their connection is up) and then lets rank 0 start a recv from it (its
// first contact: a connection refused from the start). Both must fail naming rank 2, gone,
// within seconds.
void killed_peer(const std::string& scheme) {
  const int world = 3, victim = 2;
  temp_dir dir;
  const std::string rdv = scheme == "tcp" ? "tcp://127.0.0.1:" + std::to_string(free_port()) : dir.ipc("rdv");
  int ready[2], go[2];
  BOOST_REQUIRE(::pipe(ready) == 0);
  BOOST_REQUIRE(::pipe(go) == 0);
  auto kids = fork_ranks(world, [&](int r) {
    ::close(ready[0]);
    ::close(go[1]);
    auto o = options(r, world, rdv);
    o.timeout = 30s;  // the failure must come long before
    if (scheme == "tcp") o.transport = "zmq-tcp";
    try {
      g::ring_allreduce comm(o);
      std::vector<float> x(1000);
      if (r == 1 || r == 2) {  // 1 and 2 talk first
        comm.send(std::span<const float>(x), 3 - r);
        comm.recv(std::span<float>(x), 3 - r);
      }
      comm.barrier();
      const char c = 'x';
      if (::write(ready[1], &c, 1) != 1) return 4;
      if (r == 2) {
        std::this_thread::sleep_for(60s);  // killed before
        return 5;
      }
      if (r == 0) {  // waits for the parent's word that rank 2 is dead
        char w;
        if (::read(go[0], &w, 1) != 1) return 6;
      }
      const auto t0 = steady::now();
      try {
        comm.recv(std::span<float>(x), victim);
      } catch (const g::comm_error& e) {
        const double took = std::chrono::duration<double>(steady::now() - t0).count();
        std::ofstream(dir.path / ("rank" + std::to_string(r) + ".err")) << took << "\n" << e.peer << "\n" << e.peer_state << "\n" << e.what();
        return 3;
      }
      return 0;  // never: rank 2 sends nothing
    } catch (const std::exception& e) {
      std::ofstream(dir.path / ("rank" + std::to_string(r) + ".other")) << e.what();
      return 7;
    }
  });
  ::close(ready[1]);
  ::close(go[0]);
  int seen = 0;
  const auto until = steady::now() + 30s;
  while (seen < world && steady::now() < until) {
    char c;
    const auto got = ::read(ready[0], &c, 1);
    if (got == 1) ++seen;
    else if (got == 0) break;
  }
  ::close(ready[0]);
  std::this_thread::sleep_for(200ms);  // rank 1 is in its recv by now
  ::kill(kids[victim].pid, SIGKILL);
  const auto killed_at = steady::now();
  const auto dead = reap(kids, {victim}, 10s);
  const char w = 'g';
  BOOST_TEST(::write(go[1], &w, 1) == 1);
  ::close(go[1]);
  const auto st = reap(kids, {0, 1}, 30s);
  BOOST_TEST_CONTEXT(scheme) {
    BOOST_TEST(seen == world);
    BOOST_TEST(dead[victim].status == -SIGKILL);
    for (int r : {0, 1}) {
      BOOST_TEST_CONTEXT("rank " << r << " " << slurp(dir.path / ("rank" + std::to_string(r) + ".other"))) {
        BOOST_TEST(st[r].status == 3, "rank " << r << " exited with " << st[r].status);
        std::istringstream in(slurp(dir.path / ("rank" + std::to_string(r) + ".err")));
        double took = 99;
        int peer = -1;
        std::string state, what;
        in >> took >> peer >> state;
        std::getline(in >> std::ws, what, '\0');
        const double since_kill = std::chrono::duration<double>(st[r].at - killed_at).count();
        BOOST_TEST(took < 10.0, "rank " << r << " took " << took << " s: " << what);
        if (r == 1) BOOST_TEST(since_kill < 10.0);
        BOOST_TEST(peer == victim, what);
        BOOST_TEST(state == "gone", what);
        BOOST_TEST(contains(what, "rank 2"), what);
        BOOST_TEST(contains(what, "recv of 1000 float32 from rank 2"), what);
        BOOST_TEST_MESSAGE(scheme << ": rank " << r << " failed after " << took << " s: " << what);
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_killed_peer_fails_a_waiting_recv_within_seconds) {
  killed_peer("ipc");
  killed_peer("tcp");
}

// ---- threads ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_pair_exchanges_every_size_inproc) {
  zmq::context_t ctx;
  for (int world : {1, 2, 3, 4}) {
    const std::string rdv = "inproc://pairs" + std::to_string(world);
    auto res = on_threads(world, [&](int r) {
      g::ring_allreduce comm(options(r, world, rdv, &ctx));
      exchange_all_pairs(comm);
    });
    BOOST_TEST_CONTEXT("world " << world) { require_no_errors(res); }
  }
}

BOOST_AUTO_TEST_CASE(order_is_kept_and_other_sources_queue_meanwhile) {
  zmq::context_t ctx;
  const int world = 3;
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(options(r, world, "inproc://order", &ctx));
    std::vector<double> x(10);
    if (r == 2) {
      // first on the wire, but rank 1 asks for rank 0's messages first
      for (int k = 0; k < 5; ++k) send_one<double>(comm, 1, 100 + k, 10);
    } else if (r == 0) {
      std::this_thread::sleep_for(50ms);
      for (int k = 0; k < 20; ++k) send_one<double>(comm, 1, k, 10 + k);  // of different sizes, in order
    } else {
      for (int k = 0; k < 20; ++k) expect_one<double>(comm, 0, k, 10 + k);
      for (int k = 0; k < 5; ++k) expect_one<double>(comm, 2, 100 + k, 10);
    }
    // sends and recvs around collectives: a message posted before an all-reduce is
    // received after it, and the all-reduce is not confused by it
    if (r == 0) send_one<float>(comm, 2, 7, 5000);
    std::vector<float> y(5000, 1.f);
    comm.allreduce_sum(std::span<float>(y));
    if (y[4999] != 3.f) throw std::runtime_error("allreduce");
    if (r == 2) expect_one<float>(comm, 0, 7, 5000);
    comm.barrier();
  });
  require_no_errors(res);
}

BOOST_AUTO_TEST_CASE(a_recv_of_the_wrong_size_or_dtype_names_the_peer_and_both_sizes) {
  zmq::context_t ctx;
  const int world = 2;
  std::vector<std::string> size_err(world), dtype_err(world);
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(options(r, world, "inproc://mismatch", &ctx));
    if (r == 0) {
      send_one<float>(comm, 1, 0, 7);
      send_one<double>(comm, 1, 1, 4);
    } else {
      std::vector<float> big(1000);
      try {
        comm.recv(std::span<float>(big), 0);
      } catch (const g::comm_error&) {
        throw std::runtime_error("a size mismatch is not a communication failure");
      } catch (const g::error& e) {
        size_err[r] = e.what();
      }
      expect_one<float>(comm, 0, 0, 7);  // the message stayed queued; the communicator is usable
      std::vector<float> four(4);
      try {
        comm.recv(std::span<float>(four), 0);
      } catch (const g::error& e) {
        dtype_err[r] = e.what();
      }
      expect_one<double>(comm, 0, 1, 4);
    }
    comm.barrier();
    // ranks outside the world are usage errors
    std::vector<float> x(1);
    try {
      comm.send(std::span<const float>(x), 2);
      throw std::runtime_error("send to rank 2 of 2 went through");
    } catch (const g::comm_error&) {
      throw;
    } catch (const g::error& e) {
      if (!contains(e.what(), "send to rank 2 of a world of 2")) throw std::runtime_error(std::string("wrong text: ") + e.what());
    }
  });
  require_no_errors(res);
  BOOST_TEST_MESSAGE(size_err[1]);
  BOOST_TEST(contains(size_err[1], "recv of 1000 float32 from rank 0 on rank 1"), size_err[1]);
  BOOST_TEST(contains(size_err[1], "rank 0's message holds 7 float32 (28 bytes)"), size_err[1]);
  BOOST_TEST(contains(size_err[1], "expects 1000 float32 (4000 bytes)"), size_err[1]);
  BOOST_TEST(contains(dtype_err[1], "rank 0's message holds 4 float64 (32 bytes)"), dtype_err[1]);
  BOOST_TEST(contains(dtype_err[1], "expects 4 float32 (16 bytes)"), dtype_err[1]);
}

BOOST_AUTO_TEST_CASE(a_world_of_one_sends_to_itself) {
  g::ring_allreduce comm(options(0, 1, ""));
  exchange_all_pairs(comm);
  std::vector<float> x(3);
  BOOST_CHECK_THROW(comm.recv(std::span<float>(x), 0), g::error);  // nothing sent: it would wait forever
  auto sg = comm.split(5, 0);
  BOOST_TEST(sg.world_size() == 1);
  exercise_group(sg, {0}, 0);
}

BOOST_AUTO_TEST_CASE(split_into_even_and_odd_ranks_inproc) {
  zmq::context_t ctx;
  const int world = 4;
  std::vector<std::uint64_t> sums(world);
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(options(r, world, "inproc://split", &ctx));
    // a message on the parent, sent before the split and received after the group's work
    if (r == 0) send_one<float>(comm, 2, 9, 100);
    auto sg = comm.split(r % 2, r);  // {0, 2} and {1, 3}
    sums[r] = exercise_group(sg, r % 2 ? std::vector<int>{1, 3} : std::vector<int>{0, 2}, r);
    if (r == 2) expect_one<float>(comm, 0, 9, 100);
    // the parent's collectives go on beside the group's
    std::vector<double> y(10, 1.0);
    comm.allreduce_sum(std::span<double>(y));
    if (y[9] != 4.0) throw std::runtime_error("parent allreduce after split");
  });
  require_no_errors(res);
  BOOST_TEST(sums[0] == sums[2]);
  BOOST_TEST(sums[1] == sums[3]);
}

BOOST_AUTO_TEST_CASE(split_ranks_by_key_then_rank_and_splits_again) {
  zmq::context_t ctx;
  const int world = 4;
  std::vector<std::uint64_t> sums(world);
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(options(r, world, "inproc://split-key", &ctx));
    // {0, 1, 2} ranked by descending rank (keys -r), and {3} alone
    auto sg = comm.split(r == 3 ? 1 : 0, -r);
    const std::vector<int> want = r == 3 ? std::vector<int>{3} : std::vector<int>{2, 1, 0};
    sums[r] = exercise_group(sg, want, r);
    // equal keys: by rank in the parent; then a group of the group
    auto all = comm.split(7, 0);
    if (all.members() != std::vector<int>{0, 1, 2, 3} || all.rank() != r) throw std::runtime_error("equal keys not ranked by rank");
    auto pairs = all.split(r / 2, 0);  // {0, 1} and {2, 3}
    (void)exercise_group(pairs, r < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3}, r);
    // and the first group still works beside the later ones
    sg.barrier();
  });
  require_no_errors(res);
  BOOST_TEST(sums[0] == sums[1]);
  BOOST_TEST(sums[1] == sums[2]);
}

BOOST_AUTO_TEST_CASE(a_negative_color_is_named_on_every_rank) {
  zmq::context_t ctx;
  const int world = 3;
  std::vector<std::string> errs(world);
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(options(r, world, "inproc://negative", &ctx));
    try {
      (void)comm.split(r == 2 ? -1 : 0, 0);
    } catch (const g::comm_error&) {
      throw;
    } catch (const g::error& e) {
      errs[r] = e.what();
    }
    std::vector<float> x(5, 1.f);
    comm.allreduce_sum(std::span<float>(x));  // still usable
    if (x[0] != 3.f) throw std::runtime_error("allreduce after a refused split");
  });
  require_no_errors(res);
  for (int r = 0; r < world; ++r)
    BOOST_TEST(errs[r] == "gradus: ring_allreduce: split with color -1 (rank 2): a color is >= 0, every rank joins a group");
}

BOOST_AUTO_TEST_CASE(mismatched_group_collectives_are_named) {
  zmq::context_t ctx;
  const int world = 2;
  auto res = on_threads(world, [&](int r) {
    auto o = options(r, world, "inproc://group-mismatch", &ctx);
    o.timeout = 5s;
    g::ring_allreduce comm(o);
    auto sg = comm.split(0, 0);
    std::vector<float> x(10);
    if (r == 0) sg.allreduce_sum(std::span<float>(x));
    else sg.broadcast(std::span<float>(x), 0);
  });
  // rank 1 receives rank 0's all-reduce message while it broadcasts; rank 0 then waits in vain
  BOOST_TEST_REQUIRE(res[1].error.has_value());
  BOOST_TEST(res[1].comm_error);
  BOOST_TEST(contains(*res[1].error, "rank 0 (rank 0 of the group) is running allreduce_sum #1 (float32, 10 elements)"), *res[1].error);
  BOOST_TEST(contains(*res[1].error, "is running broadcast #1 from rank 0 (float32, 10 elements)"), *res[1].error);
  BOOST_TEST(res[0].error.has_value());
}

BOOST_AUTO_TEST_CASE(a_sub_group_must_not_outlive_its_parent) {
  std::optional<g::ring::sub_group> sg;
  {
    g::ring_allreduce comm(options(0, 1, ""));
    sg.emplace(comm.split(0, 0));
    sg->barrier();
  }
  BOOST_CHECK_THROW(sg->barrier(), g::error);
  std::vector<float> x(1);
  BOOST_CHECK_THROW(sg->send(std::span<const float>(x), 0), g::error);
}

BOOST_AUTO_TEST_CASE(the_holders_take_the_ring) {
  zmq::context_t ctx;
  const int world = 2;
  auto res = on_threads(world, [&](int r) {
    auto comm = std::make_shared<g::ring_allreduce>(options(r, world, "inproc://holders", &ctx));
    auto p2p = g::parallel::any_point_to_point::share(comm);
    auto coll = g::parallel::any_collectives::share(comm);
    send_one<double>(p2p, 1 - r, 0, 33);
    expect_one<double>(p2p, 1 - r, 0, 33);
    auto sg = coll.split(0, -r);  // both, reversed
    if (sg.rank() != 1 - r) throw std::runtime_error("any_collectives::split: wrong rank");
    std::vector<float> x(3, static_cast<float>(r + 1));
    sg.allreduce_sum(std::span<float>(x));
    if (x[2] != 3.f) throw std::runtime_error("any_collectives::split: allreduce");
  });
  require_no_errors(res);
}

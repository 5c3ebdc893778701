// gradus::ring_allreduce: results against a sum computed apart (in double), the same bits
// on every rank, broadcast and barrier, and failures: a rank that leaves or dies makes the
// others throw an error naming it within 5 s, a rank that never arrives at rendezvous is
// named after the timeout, mismatched collectives are named. Ranks run as threads (inproc://,
// ipc://, tcp://127.0.0.1) and as forked processes (ipc://, tcp://127.0.0.1, one killed with
// SIGKILL). Every wait in here is bounded by the communicator's timeout.
#define BOOST_TEST_MODULE dist_ring_allreduce
#include <boost/test/unit_test.hpp>

#include <gradus/comm/ring.hpp>

#include "../../support/free_port.hpp"
#include "../../support/rank_harness.hpp"
#include "ring_inputs.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

namespace g = gradus;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

using steady = std::chrono::steady_clock;

using gradus_test::contains;
using gradus_test::on_threads;
using gradus_test::rank_result;
using gradus_test::slurp;
using gradus_test::temp_dir;
using gradus_test::free_port;
using ring_test::input, ring_test::inputs, ring_test::checksum, ring_test::max_error, ring_test::require_no_errors,
    ring_test::options;

// Sum (or average) `n` elements on `world` ranks built by make(rank); checks every rank
// against the reference and all ranks' bits against each other.
template <class T>
void check_allreduce(int world, std::size_t n, bool average, const std::function<g::ring_options(int)>& make) {
  std::vector<std::vector<T>> got(world);
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(make(r));
    if (comm.rank() != r || comm.world_size() != world) throw std::runtime_error("wrong rank or world_size");
    got[r] = inputs<T>(r, n);
    if (average) comm.allreduce_average(std::span<T>(got[r]));
    else comm.allreduce_sum(std::span<T>(got[r]));
  });
  BOOST_TEST_CONTEXT("world " << world << ", " << n << " elements of " << (sizeof(T) == 4 ? "float" : "double")
                              << (average ? ", average" : ", sum")) {
    require_no_errors(res);
    for (int r = 1; r < world; ++r) BOOST_TEST(checksum(got[r]) == checksum(got[0]), "rank " << r << "'s bits differ from rank 0's");
    const double tol = (sizeof(T) == 4 ? 2e-6 : 1e-14) * world;
    BOOST_TEST(max_error(got[0], world, average) <= tol);
  }
}

}  // namespace

// ---- processes (first: fork before any ZeroMQ context or thread exists) ------------------

namespace {

using gradus_test::fork_ranks;
using gradus_test::reap;

void process_allreduce(const std::string& name, bool tcp) {
  const int world = 3;
  const std::size_t n = 100003;
  temp_dir dir;
  const std::string rdv = tcp ? "tcp://127.0.0.1:" + std::to_string(free_port()) : dir.ipc("rdv");
  auto kids = fork_ranks(world, [&](int r) {
    auto o = options(r, world, rdv);
    o.transport = tcp ? "tcp" : "auto";
    o.segment_bytes = 64 << 10;
    g::ring_allreduce comm(o);
    auto x = inputs<float>(r, n);
    comm.broadcast(std::span<float>(x), 1);  // everyone now holds rank 1's inputs
    for (std::size_t i = 0; i < n; i += 9973)
      if (x[i] != input<float>(1, i)) return 2;
    x = inputs<float>(r, n);
    comm.allreduce_sum(std::span<float>(x));
    comm.barrier();
    std::ofstream(dir.path / ("rank" + std::to_string(r))) << checksum(x) << " " << max_error(x, world, false) << " " << comm.transport();
    return 0;
  });
  const auto st = reap(kids, 60s);
  BOOST_TEST_CONTEXT(name) {
    for (int r = 0; r < world; ++r) BOOST_TEST(st[r].status == 0, "rank " << r << " exited with " << st[r].status);
    std::vector<std::string> sums;
    for (int r = 0; r < world; ++r) {
      std::istringstream in(slurp(dir.path / ("rank" + std::to_string(r))));
      std::string sum, transport;
      double err = 1;
      in >> sum >> err >> transport;
      sums.push_back(sum);
      BOOST_TEST(err <= 1e-5);
      BOOST_TEST(transport == (tcp ? "tcp" : gradus_test::auto_transport_on_one_host()));
    }
    for (int r = 1; r < world; ++r) BOOST_TEST(sums[r] == sums[0], "rank " << r << "'s checksum differs");
  }
}

// Four processes all-reduce in a loop; rank 2 is killed with SIGKILL in the middle. The
// others must exit with an error that names rank 2 and the operation, within 5 s.
void process_killed(const std::string& name, bool tcp) {
  const int world = 4, victim = 2;
  temp_dir dir;
  const std::string rdv = tcp ? "tcp://127.0.0.1:" + std::to_string(free_port()) : dir.ipc("rdv");
  int ready[2];
  BOOST_REQUIRE(::pipe(ready) == 0);
  auto kids = fork_ranks(world, [&](int r) {
    ::close(ready[0]);
    auto o = options(r, world, rdv);
    o.transport = tcp ? "tcp" : "ipc";
    o.timeout = 30s;  // failure must be noticed long before this
    try {
      g::ring_allreduce comm(o);
      std::vector<float> x(1 << 18);  // freed before comm: a failed collective no longer reads it
      for (int it = 0; it < 200000; ++it) {  // ~ minutes; the kill comes after 0.3 s
        std::fill(x.begin(), x.end(), 1.f);
        comm.allreduce_average(std::span<float>(x));
        if (it == 3) {
          const char c = 'x';
          if (::write(ready[1], &c, 1) != 1) return 4;
        }
      }
      return 0;  // never: rank 2 dies first
    } catch (const g::comm_error& e) {
      std::ofstream(dir.path / ("rank" + std::to_string(r) + ".err")) << e.what();
      return 3;
    }
  });
  ::close(ready[1]);
  // Wait until every rank is through a few collectives (bounded: 30 s).
  int seen = 0;
  const auto until = steady::now() + 30s;
  while (seen < world && steady::now() < until) {
    char c;
    const auto got = ::read(ready[0], &c, 1);
    if (got == 1) ++seen;
    else if (got == 0) break;
  }
  ::close(ready[0]);
  std::this_thread::sleep_for(300ms);
  ::kill(kids[victim].pid, SIGKILL);
  const auto killed_at = steady::now();
  const auto st = reap(kids, 20s);
  BOOST_TEST_CONTEXT(name) {
    BOOST_TEST(seen == world);
    BOOST_TEST(st[victim].status == -SIGKILL);
    for (int r = 0; r < world; ++r) {
      if (r == victim) continue;
      const double after = std::chrono::duration<double>(st[r].at - killed_at).count();
      BOOST_TEST(st[r].status == 3, "rank " << r << " exited with " << st[r].status);
      BOOST_TEST(after < 5.0, "rank " << r << " took " << after << " s");
      const std::string msg = slurp(dir.path / ("rank" + std::to_string(r) + ".err"));
      BOOST_TEST(contains(msg, "rank 2"), "rank " << r << ": " << msg);
      BOOST_TEST(contains(msg, "allreduce"), "rank " << r << ": " << msg);
      BOOST_TEST_MESSAGE(name << ": rank " << r << " failed after " << after << " s: " << msg);
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(processes_over_ipc_and_tcp) {
  process_allreduce("ipc", false);
  process_allreduce("tcp", true);
}

BOOST_AUTO_TEST_CASE(killed_process_makes_the_others_fail_fast) {
  process_killed("ipc", false);
  process_killed("tcp", true);
}

// ---- threads ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(allreduce_sweep_inproc) {
  zmq::context_t ctx;
  int job = 0;
  for (int world = 1; world <= 8; ++world) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1000}, std::size_t{1000003}, std::size_t{4} << 20}) {
      const std::string rdv = "inproc://sweep" + std::to_string(job++);
      check_allreduce<float>(world, n, false, [&](int r) { return options(r, world, rdv, &ctx); });
    }
    // The same small sizes through the ring itself (small_bytes 0: no all-gather path),
    // chunks of one element and empty ones included.
    for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{1000}}) {
      const std::string rdv = "inproc://sweep-ring" + std::to_string(job++);
      check_allreduce<float>(world, n, true, [&](int r) {
        auto o = options(r, world, rdv, &ctx);
        o.small_bytes = 0;
        return o;
      });
    }
    // Many small segments: chunks of a few elements pipelined through the ring.
    const std::string rdv = "inproc://small-segments" + std::to_string(world);
    check_allreduce<float>(world, 1000, true, [&](int r) {
      auto o = options(r, world, rdv, &ctx);
      o.segment_bytes = 64;
      return o;
    });
  }
  for (int world : {2, 3, 7})
    for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{100003}}) {
      const std::string rdv = "inproc://double" + std::to_string(job++);
      check_allreduce<double>(world, n, true, [&](int r) { return options(r, world, rdv, &ctx); });
      const std::string rdv2 = "inproc://double" + std::to_string(job++);
      check_allreduce<double>(world, n, false, [&](int r) { return options(r, world, rdv2, &ctx); });
    }
}

BOOST_AUTO_TEST_CASE(allreduce_over_ipc_and_tcp_threads) {
  temp_dir dir;
  int job = 0;
  for (int world : {2, 3, 5})
    for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{1000003}}) {
      const std::string rdv = dir.ipc("rdv" + std::to_string(job++));
      check_allreduce<float>(world, n, true, [&](int r) { return options(r, world, rdv); });  // a context per rank
    }
  for (int world : {2, 4})
    for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{1000003}}) {
      const std::string rdv = "tcp://127.0.0.1:" + std::to_string(free_port());
      check_allreduce<float>(world, n, false, [&](int r) {
        auto o = options(r, world, rdv);
        o.transport = "tcp";
        return o;
      });
    }
  check_allreduce<double>(3, 77777, true, [&](int r) {
    auto o = options(r, 3, dir.ipc("double"));
    o.segment_bytes = 4096;
    return o;
  });
}

BOOST_AUTO_TEST_CASE(auto_transport_picks_shared_memory_on_one_host) {
  const int world = 2;
  const std::string rdv = "tcp://127.0.0.1:" + std::to_string(free_port());
  std::vector<std::string> transports(world), addr0(world);
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(options(r, world, rdv));
    transports[r] = comm.transport();
    addr0[r] = comm.addresses().at(0);
  });
  require_no_errors(res);
  BOOST_TEST(transports[0] == gradus_test::auto_transport_on_one_host());
  BOOST_TEST(transports[1] == gradus_test::auto_transport_on_one_host());
  BOOST_TEST(addr0[0] == addr0[1]);
  BOOST_TEST(addr0[0].rfind(gradus_test::auto_address_prefix(), 0) == 0u, addr0[0]);
}

BOOST_AUTO_TEST_CASE(broadcast_from_every_root) {
  zmq::context_t ctx;
  int job = 0;
  for (int world : {1, 2, 4})
    for (int root = 0; root < world; ++root)
      for (std::size_t n : {std::size_t{0}, std::size_t{5}, std::size_t{300001}}) {
        const std::string rdv = "inproc://bcast" + std::to_string(job++);
        std::vector<std::vector<double>> got(world);
        auto res = on_threads(world, [&](int r) {
          auto o = options(r, world, rdv, &ctx);
          o.segment_bytes = 64 << 10;
          g::ring_allreduce comm(o);
          got[r] = inputs<double>(r, n);
          comm.broadcast(std::span<double>(got[r]), root);
          std::vector<float> f = inputs<float>(r, 7);
          comm.broadcast(std::span<float>(f), root);
          if (f != inputs<float>(root, 7)) throw std::runtime_error("float broadcast differs");
        });
        BOOST_TEST_CONTEXT("world " << world << ", root " << root << ", " << n << " elements") {
          require_no_errors(res);
          const auto want = inputs<double>(root, n);
          for (int r = 0; r < world; ++r) BOOST_TEST((got[r] == want), "rank " << r);
        }
      }
  // A root outside the world is a usage error, raised before anything is sent.
  g::ring_allreduce one(options(0, 1, ""));
  std::vector<float> x(3);
  BOOST_CHECK_THROW(one.broadcast(std::span<float>(x), 1), g::error);
}

BOOST_AUTO_TEST_CASE(barrier_waits_for_the_last_rank) {
  zmq::context_t ctx;
  const int world = 4;
  std::vector<steady::time_point> entered(world), left(world);
  auto res = on_threads(world, [&](int r) {
    g::ring_allreduce comm(options(r, world, "inproc://barrier", &ctx));
    for (int round = 0; round < 3; ++round) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * ((r + round) % world)));
      entered[r] = steady::now();
      comm.barrier();
      left[r] = steady::now();
      comm.barrier();  // nobody overwrites `entered` before all have read it
      for (int q = 0; q < world; ++q)
        if (left[r] < entered[q]) throw std::runtime_error("left the barrier before rank " + std::to_string(q) + " entered");
      comm.barrier();
    }
  });
  require_no_errors(res);
}

// ---- failures ------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_rank_that_leaves_is_named_by_every_other_rank) {
  zmq::context_t ctx;
  const int world = 4, leaver = 2;
  std::atomic<int> gone{0};
  steady::time_point left_at{};
  auto res = on_threads(world, [&](int r) {
    std::vector<float> x(100000, 1.f);
    {
      auto o = options(r, world, "inproc://leave", &ctx);
      g::ring_allreduce comm(o);
      for (int i = 0; i < 3; ++i) comm.allreduce_sum(std::span<float>(x));
      if (r == leaver) {
        left_at = steady::now();
        gone = 1;
        return;  // destroys its communicator: the others are in, or about to enter, the 4th
      }
      while (!gone) std::this_thread::sleep_for(1ms);
      const auto t = steady::now();
      try {
        comm.allreduce_sum(std::span<float>(x));
      } catch (...) {
        if (steady::now() - t > 5s) throw std::runtime_error("took more than 5 s");
        throw;
      }
    }
  });
  for (int r = 0; r < world; ++r) {
    if (r == leaver) {
      BOOST_TEST(!res[r].error.has_value());
      continue;
    }
    BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r << " did not fail");
    BOOST_TEST(res[r].comm_error, *res[r].error);
    BOOST_TEST(contains(*res[r].error, "rank 2"), *res[r].error);
    BOOST_TEST(contains(*res[r].error, "allreduce_sum #4"), *res[r].error);
  }
}

BOOST_AUTO_TEST_CASE(a_rank_whose_context_closes_mid_training_is_named_within_5s) {
  temp_dir dir;
  for (std::string transport : {"ipc", "tcp"}) {
    const int world = 4, victim = 2;
    const std::string rdv = transport == "ipc" ? dir.ipc("ctx") : "tcp://127.0.0.1:" + std::to_string(free_port());
    std::vector<std::unique_ptr<zmq::context_t>> ctxs;
    for (int r = 0; r < world; ++r) ctxs.push_back(std::make_unique<zmq::context_t>());
    std::atomic<int> started{0};
    steady::time_point shut_at{};
    std::thread killer([&] {
      const auto until = steady::now() + 30s;
      while (started < world && steady::now() < until) std::this_thread::sleep_for(1ms);
      std::this_thread::sleep_for(200ms);
      shut_at = steady::now();
      ctxs[victim]->shutdown();  // every ZeroMQ call of rank 2 now fails (ETERM)
    });
    auto res = on_threads(
        world,
        [&](int r) {
          auto o = options(r, world, rdv, ctxs[r].get());
          o.transport = transport;
          g::ring_allreduce comm(o);
          std::vector<float> x(1 << 16);  // freed before comm: a failed collective no longer reads it
          for (int it = 0; it < 100000; ++it) {  // bounded; the failure comes within ~0.2 s
            std::fill(x.begin(), x.end(), 1.f);
            comm.allreduce_sum(std::span<float>(x));
            if (it == 2) ++started;
          }
        });
    killer.join();
    BOOST_TEST_CONTEXT(transport) {
      for (int r = 0; r < world; ++r) {
        BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r << " did not fail");
        BOOST_TEST(res[r].comm_error, *res[r].error);
        if (r == victim) continue;
        const double after = std::chrono::duration<double>(res[r].ended - shut_at).count();
        BOOST_TEST(after < 5.0, "rank " << r << " took " << after << " s");
        BOOST_TEST_MESSAGE(transport << ": rank " << r << " failed " << after << " s after rank 2's context closed: " << *res[r].error);
        BOOST_TEST(contains(*res[r].error, "rank 2"), *res[r].error);
        BOOST_TEST(contains(*res[r].error, "allreduce"), *res[r].error);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_rank_that_never_arrives_is_named_after_the_timeout) {
  temp_dir dir;
  const int world = 4;
  const auto t0 = steady::now();
  auto res = on_threads(3, [&](int r) {  // ranks 0..2 of 4: rank 3 never starts
    auto o = options(r, world, dir.ipc("rdv"));
    o.timeout = o.rendezvous_timeout = 300ms;
    g::ring_allreduce comm(o);
  });
  BOOST_TEST(std::chrono::duration<double>(steady::now() - t0).count() < 5.0);
  for (int r = 0; r < 3; ++r) {
    BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r);
    BOOST_TEST(res[r].comm_error);
    BOOST_TEST(contains(*res[r].error, "rank 3 of world_size 4 did not register within 300 ms"), *res[r].error);
  }
}

BOOST_AUTO_TEST_CASE(a_stalled_rank_times_out_the_others) {
  zmq::context_t ctx;
  const int world = 3;
  auto res = on_threads(world, [&](int r) {
    auto o = options(r, world, "inproc://stall", &ctx);
    o.timeout = 400ms;
    g::ring_allreduce comm(o);
    std::vector<float> x(1000, 1.f);
    if (r == 2) std::this_thread::sleep_for(1200ms);  // alive, but not in the collective
    comm.allreduce_sum(std::span<float>(x));
  });
  BOOST_TEST_REQUIRE(res[0].error.has_value());
  BOOST_TEST(contains(*res[0].error, "no message from rank 2"), *res[0].error);
  BOOST_TEST(contains(*res[0].error, "within 400 ms"), *res[0].error);
  BOOST_TEST(contains(*res[0].error, "allreduce_sum #1"), *res[0].error);
  for (int r = 1; r < world; ++r) BOOST_TEST(res[r].error.has_value(), "rank " << r << " did not fail");
}

// The rendezvous waits at least 5 s by default (ring_options::rendezvous_timeout), however
// short the collectives' timeout: a rank that arrives 1.2 s after the others, as processes
// started together do under load, meets them with a timeout of 100 ms.
BOOST_AUTO_TEST_CASE(a_short_timeout_still_gives_the_rendezvous_seconds) {
  temp_dir dir;
  auto res = on_threads(2, [&](int r) {
    auto o = options(r, 2, dir.ipc("late"));
    o.timeout = 100ms;
    if (r == 1) std::this_thread::sleep_for(1200ms);
    g::ring_allreduce comm(o);
    std::vector<float> x(10, 1.f);
    comm.allreduce_sum(std::span<float>(x));
    if (x[9] != 2.f) throw std::runtime_error("sum " + std::to_string(x[9]));
  });
  for (int r = 0; r < 2; ++r) BOOST_TEST(!res[r].error.has_value(), "rank " << r << ": " << res[r].error.value_or(""));
}

namespace {
// A registration sent to rank 0's rendezvous by hand (a process of another launch claiming
// `rank`), and rank 0's reply: "ok..." or "error\n<reason>"; "" when none came within 5 s.
std::string claim_by_hand(zmq::context_t& ctx, const std::string& rdv, int rank, int world, const std::string& launch) {
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.connect(rdv);
  const std::string text = g::ring::format_registration(
      {rank, world, "stranger", "machine", "inproc", "", "4242", launch, {"inproc://stranger-data", "p2p+inproc://stranger-p2p"}});
  d.send(zmq::buffer(text), zmq::send_flags::none);
  zmq::pollitem_t item{d.handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, std::chrono::milliseconds(5000));
  zmq::message_t reply;
  return d.recv(reply, zmq::recv_flags::dontwait) ? reply.to_string() : std::string();
}
}  // namespace

BOOST_AUTO_TEST_CASE(registration_errors_name_both_sides) {
  zmq::context_t ctx;
  // Two processes claim rank 1 and neither is of another launch than rank 0 (here: threads of
  // one process): both are refused by name and the job stops at once, not at a timeout —
  // while the ring forms (inproc, a world of 3 whose rank 2 never comes), and after it formed
  // (tcp, ranks started by hand with no job id: the second claim 200 ms later, another job's
  // rank sent to this MASTER_PORT; rank 0 still listens, second_claim_wait)
  for (const bool tcp : {false, true}) {
    BOOST_TEST_CONTEXT((tcp ? "tcp, the ring formed" : "inproc, while the ring forms")) {
      const std::string rdv = tcp ? "tcp://127.0.0.1:" + std::to_string(free_port()) : "inproc://dup";
      const auto t0 = steady::now();
      auto res = on_threads(3, [&](int t) {
        if (tcp && t == 2) std::this_thread::sleep_for(200ms);
        auto o = options(t == 2 ? 1 : t, tcp ? 2 : 3, rdv, tcp ? nullptr : &ctx);
        o.timeout = 20s;
        g::ring_allreduce comm(o);
      });
      BOOST_TEST(std::chrono::duration<double>(steady::now() - t0).count() < 10.0);
      for (int t = 0; t < 3; ++t) {
        BOOST_TEST_REQUIRE(res[t].error.has_value(), "thread " << t);
        BOOST_TEST(contains(*res[t].error, "rank 1 registered twice, by pid "), *res[t].error);
        BOOST_TEST(contains(*res[t].error, "both are refused and the job stops; two jobs on one rendezvous port? Give each "
                                           "job its own MASTER_PORT (gradus-run --port), or set GRADUS_JOB_ID"),
                   *res[t].error);
      }
    }
  }
  {  // a claim of another launch than rank 0's, before or after the job's own: the job's is
     // kept (it takes the stranger's place), the stranger refused alone, naming both
    for (const bool stranger_first : {true, false}) {
      BOOST_TEST_CONTEXT("the stranger " << (stranger_first ? "first" : "second")) {
        const std::string rdv = "inproc://launch" + std::to_string(stranger_first);
        std::string reply;
        auto res = on_threads(3, [&](int t) {
          if (t == 2) {
            std::this_thread::sleep_for(stranger_first ? 0ms : 300ms);
            reply = claim_by_hand(ctx, rdv, 1, 3, "parent pid 1 started at tick 7 of boot 00000000");
            return;
          }
          if (t == 1) std::this_thread::sleep_for(stranger_first ? 300ms : 0ms);
          auto o = options(t, 2 + 1, rdv, &ctx);
          o.timeout = 5s;
          if (t == 0) {  // rank 0 of a world of 3 whose rank 2 never comes: it names the missing one
            o.rendezvous_timeout = 1500ms;
          }
          g::ring_allreduce comm(o);
        });
        BOOST_TEST(contains(reply, "error\n"), reply);
        BOOST_TEST(contains(reply, "rank 1 is claimed by two processes; the one of rank 0's launch (pid "), reply);
        BOOST_TEST(contains(reply, ") is kept, and this one (pid 4242 on host stranger, parent pid 1 started at tick 7"), reply);
        BOOST_TEST_REQUIRE(res[0].error.has_value());
        BOOST_TEST(contains(*res[0].error, "rank 2 of world_size 3 did not register within 1500 ms"), *res[0].error);
      }
    }
  }
  {  // a rank of another job (ring_options::job_id, from GRADUS_JOB_ID) arrives first: it is
     // refused alone, and the job's own ranks meet and reduce
    auto res = on_threads(3, [&](int t) {
      auto o = options(t == 2 ? 1 : t, 2, "inproc://jobs", &ctx);
      o.timeout = 2s;
      o.job_id = t == 2 ? "b" : "a";
      if (t == 1) std::this_thread::sleep_for(300ms);  // the stranger registers first
      g::ring_allreduce comm(o);
      std::vector<float> x(10, 1.f);
      comm.allreduce_sum(std::span<float>(x));
      if (x[9] != 2.f) throw std::runtime_error("sum " + std::to_string(x[9]));
    });
    BOOST_TEST(!res[0].error.has_value(), res[0].error.value_or(""));
    BOOST_TEST(!res[1].error.has_value(), res[1].error.value_or(""));
    BOOST_TEST_REQUIRE(res[2].error.has_value());
    BOOST_TEST(contains(*res[2].error, "rank 1 (host"), *res[2].error);
    BOOST_TEST(contains(*res[2].error, ") belongs to job 'b', rank 0 to job 'a': two jobs on one rendezvous port?"), *res[2].error);
  }
  {  // rank 1 thinks the world has 3 ranks, rank 0 that it has 2
    auto res = on_threads(2, [&](int r) {
      auto o = options(r, r == 1 ? 3 : 2, "inproc://world", &ctx);
      o.timeout = 2s;
      g::ring_allreduce comm(o);
    });
    for (int r = 0; r < 2; ++r) {
      BOOST_TEST_REQUIRE(res[r].error.has_value());
      BOOST_TEST(contains(*res[r].error, "rank 1 (host"), *res[r].error);
      BOOST_TEST(contains(*res[r].error, "registered with world_size 3, but rank 0 has world_size 2"), *res[r].error);
    }
  }
}

// Ranks that ask for different data paths (--comm-transport ipc on one, tcp on another) are
// refused at the rendezvous, naming both, each way round: rank 0's choice no longer
// overrules the others' silently, nor fails on an address they did not bind.
BOOST_AUTO_TEST_CASE(ranks_asking_for_different_transports_are_refused) {
  for (const auto& pair : std::vector<std::pair<std::string, std::string>>{{"tcp", "zmq-ipc"}, {"zmq-ipc", "tcp"}, {"shm", "tcp"}}) {
    const std::string t0 = pair.first, t1 = pair.second;  // (clang 14 cannot capture structured bindings)
    temp_dir dir;
    auto res = on_threads(2, [&](int r) {
      auto o = options(r, 2, dir.ipc("rdv"));
      o.transport = r == 0 ? t0 : t1;
      o.timeout = 3s;
      g::ring_allreduce comm(o);
    });
    BOOST_TEST_CONTEXT(t0 << " vs " << t1) {
      for (int r = 0; r < 2; ++r) {
        BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r << " did not fail");
        BOOST_TEST(contains(*res[r].error, "rank 1 (host"), *res[r].error);
        BOOST_TEST(contains(*res[r].error, "asked for transport " + t1 + ", but rank 0 for " + t0), *res[r].error);
        BOOST_TEST(contains(*res[r].error, "give every rank the same"), *res[r].error);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(mismatched_collectives_name_the_ranks) {
  zmq::context_t ctx;
  const int world = 4;
  {  // rank 2 all-reduces 999 elements, the others 1000
    auto res = on_threads(world, [&](int r) {
      auto o = options(r, world, "inproc://mismatch", &ctx);
      o.timeout = 5s;
      g::ring_allreduce comm(o);
      std::vector<float> x(r == 2 ? 999 : 1000, 1.f);
      comm.allreduce_sum(std::span<float>(x));
    });
    for (int r = 0; r < world; ++r) {
      BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r << " did not fail");
      BOOST_TEST(res[r].comm_error);
      BOOST_TEST(contains(*res[r].error, "(float32, 999 elements)"), *res[r].error);
      BOOST_TEST(contains(*res[r].error, "(float32, 1000 elements)"), *res[r].error);
    }
    // Ranks 2 and 3 each see a neighbour differ (whichever notices first aborts the other);
    // the message names both ranks with both fingerprints.
    const std::string& m3 = *res[3].error;
    const bool named = (contains(m3, "rank 2 (inproc://mismatch.rank2") &&
                contains(m3, "is running allreduce_sum #1 (float32, 999 elements) but rank 3 is running allreduce_sum #1 (float32, 1000 elements)")) ||
                   (contains(m3, "rank 1 (inproc://mismatch.rank1") &&
                    contains(m3, "is running allreduce_sum #1 (float32, 1000 elements) but rank 2 is running allreduce_sum #1 (float32, 999 elements)"));
    BOOST_TEST(named, m3);
    // and the communicator refuses further work, naming the first error
    BOOST_TEST(contains(*res[2].error, "rank 2"));
  }
  {  // ranks that disagree on the small-buffer algorithm: named, with what each runs
    auto res = on_threads(3, [&](int r) {
      auto o = options(r, 3, "inproc://mismatch-algo", &ctx);
      o.timeout = 5s;
      if (r == 1) o.small_bytes = 0;
      g::ring_allreduce comm(o);
      std::vector<float> x(100, 1.f);
      comm.allreduce_average(std::span<float>(x));
    });
    for (int r = 0; r < 3; ++r) {
      BOOST_TEST_REQUIRE(res[r].error.has_value(), "rank " << r << " did not fail");
      BOOST_TEST(contains(*res[r].error, "small_bytes (or segment_bytes) differs between ranks"), *res[r].error);
    }
    // rank 2 hears of it from rank 1 (which runs the ring), or from rank 1's abort after
    // rank 1 heard from rank 0 (which runs the all-gather)
    const std::string& m2 = *res[2].error;
    const bool named = (contains(m2, "rank 1 (inproc://mismatch-algo.rank1") &&
                        contains(m2, "runs it as the ring but rank 2 as an all-gather of whole buffers")) ||
                       (contains(m2, "rank 0 (inproc://mismatch-algo.rank0") &&
                        contains(m2, "runs it as an all-gather of whole buffers but rank 1 as the ring"));
    BOOST_TEST(named, m2);
  }
  {  // a barrier against a broadcast
    auto res = on_threads(2, [&](int r) {
      auto o = options(r, 2, "inproc://mismatch-op", &ctx);
      o.timeout = 5s;
      g::ring_allreduce comm(o);
      std::vector<double> x(10);
      if (r == 0) comm.barrier();
      else comm.broadcast(std::span<double>(x), 0);
    });
    for (int r = 0; r < 2; ++r) BOOST_TEST_REQUIRE(res[r].error.has_value());
    BOOST_TEST(contains(*res[1].error, "rank 0 (inproc://"), *res[1].error);
    BOOST_TEST(contains(*res[1].error, "barrier #1"), *res[1].error);
    BOOST_TEST(contains(*res[1].error, "broadcast #1 from rank 0 (float64, 10 elements)"), *res[1].error);
  }
}

BOOST_AUTO_TEST_CASE(a_timeout_that_is_not_positive_is_refused) {
  for (const auto t : {0ms, -1000ms}) {
    auto o = options(0, 1, "");
    o.timeout = t;
    BOOST_CHECK_EXCEPTION(g::ring_allreduce{o}, g::error, [&](const g::error& e) {
      return std::string(e.what()) == "gradus: ring_allreduce: timeout must be positive, got " + std::to_string(t.count()) +
                                         " ms (ring_options::timeout; the examples' --comm-timeout)";
    });
  }
}

BOOST_AUTO_TEST_CASE(a_world_of_one_is_the_identity) {
  g::ring_allreduce comm(options(0, 1, ""));
  BOOST_TEST(comm.transport() == "none");
  std::vector<float> x = {1.5f, -2.f, 3.25f};
  const auto before = x;
  comm.allreduce_sum(std::span<float>(x));
  comm.allreduce_average(std::span<float>(x));
  comm.broadcast(std::span<float>(x), 0);
  comm.barrier();
  BOOST_TEST((x == before));
  static_assert(g::parallel::communicator<g::ring_allreduce>);
}


#pragma once
// A parameter-server job inside one test process: S servers on threads listening on
// loopback tcp (server_pool), workers on threads with their own parameter_server each, as
// separate processes would have (on_workers), and a worker that says hello and vanishes
// without a goodbye, which is what a server sees of a killed process (vanishing_worker).
// tests/comm/ps's tests share them.
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/comm/ps.hpp>

namespace ps_test {

namespace g = gradus;
namespace wire = gradus::ps::wire;
using namespace std::chrono_literals;

// S servers on threads; they stop when every worker has said goodbye (or after 60 s of
// silence: a bound for a test that fails half-way).
struct server_pool {
  zmq::context_t ctx{1};
  std::vector<std::unique_ptr<g::ps::server<g::cpu_simd>>> servers;
  std::vector<std::thread> threads;
  std::vector<std::string> addresses;
  explicit server_pool(int n, std::chrono::milliseconds join_timeout = 60s) {
    for (int i = 0; i < n; ++i) {
      g::ps::server_options o;
      o.address = "127.0.0.1:0";
      o.index = i;
      o.idle_exit = 60s;
      o.join_timeout = join_timeout;
      if (!std::getenv("PS_TEST_LOG")) o.log = [](const std::string&) {};
      servers.push_back(std::make_unique<g::ps::server<g::cpu_simd>>(ctx, o));
      addresses.push_back(servers.back()->endpoint());
    }
    for (auto& s : servers) threads.emplace_back([p = s.get()] { p->run(); });
  }
  ~server_pool() { join(); }
  // Waits until every server's run() returned (then job_failure() is its verdict).
  void join() {
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
  g::ps_options options(int rank, int world, const std::string& consistency = "bsp") const {
    g::ps_options o;
    o.servers = addresses;
    o.rank = rank;
    o.world_size = world;
    o.timeout = 20s;
    g::parse_consistency(consistency, o);
    return o;
  }
};

// body(r) on `world` threads; the first exception is rethrown after all joined.
template <class Body>
void on_workers(int world, Body body) {
  std::vector<std::thread> ts;
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errs[static_cast<std::size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : ts) t.join();
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

// A worker that says hello as `rank` and then vanishes without a goodbye (its socket
// closes at once: what the server sees of a killed process).
void vanishing_worker(const std::vector<std::string>& servers, int rank, int world, const std::string& mode, int staleness) {
  zmq::context_t ctx(1);
  std::vector<zmq::socket_t> socks;
  const std::string hello = "{\"rank\":" + std::to_string(rank) + ",\"world_size\":" + std::to_string(world) + ",\"mode\":\"" +
                            mode + "\",\"staleness\":" + std::to_string(staleness) + "}";
  for (const auto& server : servers) {
    auto& s = socks.emplace_back(ctx, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::rcvtimeo, 5000);
    s.connect(server);
    auto h = wire::make(wire::type::hello);
    h.rank = rank;
    h.payload_bytes = hello.size();
    s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore);
    s.send(zmq::buffer(hello), zmq::send_flags::none);
    zmq::message_t reply;
    if (!s.recv(reply)) throw g::error("vanishing_worker: no answer to hello");
  }
  std::this_thread::sleep_for(200ms);
}  // closes: the connections drop

}  // namespace ps_test

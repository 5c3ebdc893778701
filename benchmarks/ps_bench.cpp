// Parameter-server throughput (issue 13, benchmark 1): one worker pushes a float variable
// of 1 MiB or 64 MiB to 1 or 2 parameter servers and pulls it back, through
// gradus::parameter_server<ps_async> and gradus::ps::server (SGD, lr 0: every push runs
// the server's update pass, which leaves the values as they are), against a raw cppzmq
// DEALER -> ROUTER loop that sends the same messages and does nothing else. Both over tcp
// on 127.0.0.1, in the same run, rounds interleaved.
//
//   ps_bench [--rounds N] [--warmup N] [--sizes-mib 1,64] [--servers 1,2] [--json]
//            [--curve off|on|both]      (default both: every configuration without and with
//                                        CurveZMQ, on both sides: gradus' ps_options::curve /
//                                        server_options::curve, and the raw loop's sockets made
//                                        CURVE client / server with the same keys and ZAP handler)
//            [--chunk-kib 1024]         (ps_options::chunk_bytes, and the raw loop's chunks)
//            [--server-omp-threads N]   (OMP_NUM_THREADS of the gradus server processes:
//                                        their optimizer pass runs on OpenMP; default inherited)
//
// The table also gives the CPU time per round of the worker process (while it ran each
// side) and of each side's server processes, and how much CPU other processes took.
//
// Processes: the worker is this process (one gradus client, own ZeroMQ context; one raw
// client, another context). For every (servers, size) it forks and execs itself as
// `--serve gradus` and `--serve raw` children, one per server, each with its own context;
// a child prints the endpoint it bound and serves until told to stop (the gradus chief's
// shutdown, the raw client's `quit`), 30 s of silence, or the parent's death
// (PR_SET_PDEATHSIG). The parent reaps every child it started, by pid. With CURVE the
// parent makes one server and one worker key pair per run and hands the server's secret
// key and the worker's public key to its children in their environment.
//
// The raw peer moves the same bytes in the same pattern: the variable cut into the same
// shards (gradus' balanced_by_bytes) and chunks (ps_options::chunk_bytes, 1 MiB by
// default); each push chunk is a 64-byte header frame plus the chunk, zero-copy from the
// gradient as the gradus client sends it, acknowledged by a header; each pull chunk is a
// header answered by a header plus the chunk, copied from the server's buffer into a
// ZeroMQ message (as gradus' server answers) and by the worker from the message into the
// output variable (as gradus' client does). What the raw loop leaves out is gradus' logic:
// the request table and polling of the client, the decoder, sender check, shard lookup and
// SGD pass of the server.
//
// A round = push the whole variable, pull it back, wait for both. A sample times k rounds
// back to back (k = 64 MiB / size, so a 1 MiB sample is not a single millisecond), gradus
// and raw alternately, in an order that flips every sample; the table gives the median
// per-round time over the samples and GB/s = (pushed + pulled bytes) / time, 1e9 bytes.
// The pulled values are checked (gradus: the initial values, lr 0; raw: the server's
// pattern) and the program fails if they differ.
#include <gradus/backends/cpu_simd.hpp>  // the servers' compute policy
#include <gradus/comm/ps.hpp>

#include <zmq.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace g = gradus;
using namespace std::chrono_literals;
using clk = std::chrono::steady_clock;

namespace {

constexpr std::size_t MiB = std::size_t(1) << 20;
constexpr auto child_idle = 30s;  // a child with nothing to do this long stops
constexpr auto io_deadline = 30s;  // one round, the raw loop's bound (gradus: ps_options::timeout)

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "ps_bench: %s\n", what.c_str());
  std::exit(1);
}

// ---- the raw peer ------------------------------------------------------------------------

// The raw messages' header: 64 bytes like gradus' wire::header, so every frame has the
// same size on both sides.
struct raw_header {
  enum kind : std::uint32_t { setup = 1, push = 2, pull = 3, ack = 4, data = 5, quit = 6 };
  std::uint32_t kind = 0;
  std::uint32_t pad = 0;
  std::uint64_t offset = 0;  // byte offset within the server's buffer (setup: its size)
  std::uint64_t bytes = 0;   // payload bytes of a push, bytes wanted by a pull
  std::uint64_t rest[5] = {};
};
static_assert(sizeof(raw_header) == 64);

// The value a raw server holds at float index i, and gradus' initial variable.
float pattern(std::size_t i) { return static_cast<float>(i % 1021) * 0.25f - 100.0f; }

// The CURVE set-up a server child was started with (PS_BENCH_CURVE_* from the parent), if
// any: the server's key pair and the one worker key allowed in, as rank 0.
std::optional<g::ps::curve_server_config> child_curve() {
  const char* secret = std::getenv("PS_BENCH_CURVE_SERVER_SECRET");
  const char* worker = std::getenv("PS_BENCH_CURVE_WORKER_PUBLIC");
  if (!secret || !worker) return std::nullopt;
  g::ps::curve_server_config c;
  c.keys.secret_key = secret;
  c.keys.public_key = g::ps::public_key_of(secret);
  c.allowed.allow(worker, 0);
  return c;
}

// A ROUTER that acknowledges pushes and answers pulls from its buffer.
int serve_raw() {
  zmq::context_t ctx(1);
  const auto curve = child_curve();
  // a CURVE server needs its context's ZAP handler (the same one gradus' server uses)
  const auto zap = curve ? g::ps::zap_handler::for_context(ctx, curve->allowed) : nullptr;
  zmq::socket_t sock(ctx, zmq::socket_type::router);
  if (curve) g::ps::make_curve_server(sock, curve->keys);
  sock.set(zmq::sockopt::linger, 0);
  sock.set(zmq::sockopt::sndhwm, 0);  // as gradus' server
  sock.set(zmq::sockopt::rcvhwm, 0);
  sock.bind("tcp://127.0.0.1:0");
  std::printf("%s\n", sock.get(zmq::sockopt::last_endpoint).c_str());
  std::fflush(stdout);
  std::vector<float> values;
  auto last = clk::now();
  while (clk::now() - last < child_idle) {
    zmq::pollitem_t item{sock.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, 100ms);
    if (!(item.revents & ZMQ_POLLIN)) continue;
    last = clk::now();
    for (int budget = 0; budget < 1024; ++budget) {
      zmq::message_t id, hdr, payload;
      if (!sock.recv(id, zmq::recv_flags::dontwait)) break;
      (void)sock.recv(hdr, zmq::recv_flags::none);
      if (hdr.more()) (void)sock.recv(payload, zmq::recv_flags::none);
      if (hdr.size() != sizeof(raw_header)) die("raw server: a header of " + std::to_string(hdr.size()) + " bytes");
      raw_header h;
      std::memcpy(&h, hdr.data(), sizeof h);
      raw_header r;
      r.offset = h.offset;
      r.bytes = h.bytes;
      sock.send(id, zmq::send_flags::sndmore);
      switch (h.kind) {
        case raw_header::setup:
          values.resize(h.offset / sizeof(float));
          for (std::size_t i = 0; i < values.size(); ++i) values[i] = pattern(i);
          r.kind = raw_header::ack;
          sock.send(zmq::buffer(&r, sizeof r), zmq::send_flags::none);
          break;
        case raw_header::push:  // the bytes arrived; nothing is done with them
          if (payload.size() != h.bytes) die("raw server: a push announcing " + std::to_string(h.bytes) + " bytes carries " + std::to_string(payload.size()));
          r.kind = raw_header::ack;
          sock.send(zmq::buffer(&r, sizeof r), zmq::send_flags::none);
          break;
        case raw_header::pull:
          if (h.offset + h.bytes > values.size() * sizeof(float)) die("raw server: a pull past the buffer's end");
          r.kind = raw_header::data;
          sock.send(zmq::buffer(&r, sizeof r), zmq::send_flags::sndmore);
          sock.send(zmq::buffer(reinterpret_cast<const char*>(values.data()) + h.offset, h.bytes), zmq::send_flags::none);
          break;
        case raw_header::quit:
          r.kind = raw_header::ack;
          sock.send(zmq::buffer(&r, sizeof r), zmq::send_flags::none);
          return 0;
        default: die("raw server: message kind " + std::to_string(h.kind));
      }
    }
  }
  return 0;
}

// The gradus server, as ps::serve runs it but on a port of the system's choosing.
int serve_gradus(int index) {
  zmq::context_t ctx(1);
  g::ps::server_options o;
  o.address = "127.0.0.1:0";
  o.index = index;
  o.curve = child_curve();
  o.idle_exit = child_idle;
  if (!std::getenv("PS_BENCH_LOG")) o.log = [](const std::string&) {};
  g::ps::server<g::cpu_simd> s(ctx, o);
  std::printf("%s\n", s.endpoint().c_str());
  std::fflush(stdout);
  s.run();
  const auto& st = s.stats();
  if (st.malformed || st.rejected)
    std::fprintf(stderr, "ps_bench: gradus server %d: %llu malformed and %llu rejected messages\n", index,
                 static_cast<unsigned long long>(st.malformed), static_cast<unsigned long long>(st.rejected));
  return 0;
}

// The raw worker: one DEALER per server, the variable cut as gradus cuts it.
class raw_client {
 public:
  struct piece {
    int server;
    std::size_t var_offset, server_offset, bytes;  // in bytes
  };

  raw_client(const std::vector<std::string>& endpoints, std::size_t var_bytes, std::size_t chunk_bytes,
             const std::optional<g::ps::curve_client_config>& curve) {
    const int n = static_cast<int>(endpoints.size());
    const auto shards = g::ps::balanced_by_bytes({{"w", var_bytes / sizeof(float), sizeof(float)}}, n);
    std::vector<std::size_t> held(static_cast<std::size_t>(n), 0);
    for (const auto& s : shards)
      for (std::size_t at = 0; at < s.count * sizeof(float); at += chunk_bytes) {
        const std::size_t b = std::min(chunk_bytes, s.count * sizeof(float) - at);
        pieces_.push_back({s.server, s.offset * sizeof(float) + at, held[static_cast<std::size_t>(s.server)], b});
        held[static_cast<std::size_t>(s.server)] += b;
      }
    for (const auto& ep : endpoints) {
      zmq::socket_t d(ctx_, zmq::socket_type::dealer);
      d.set(zmq::sockopt::linger, 0);
      d.set(zmq::sockopt::sndhwm, 0);  // as gradus' client
      d.set(zmq::sockopt::rcvhwm, 0);
      if (curve) g::ps::make_curve_client(d, curve->keys, curve->server_key(socks_.size()));
      d.connect(ep);
      socks_.push_back(std::move(d));
    }
    for (std::size_t k = 0; k < socks_.size(); ++k) {
      raw_header h;
      h.kind = raw_header::setup;
      h.offset = held[k];
      socks_[k].send(zmq::buffer(&h, sizeof h), zmq::send_flags::none);
    }
    expect_ = static_cast<int>(socks_.size());
    receive({});
  }
  ~raw_client() {
    try {
      for (auto& s : socks_) {
        raw_header h;
        h.kind = raw_header::quit;
        s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::none);
      }
      expect_ = static_cast<int>(socks_.size());
      receive({}, 2s);
    } catch (...) {
    }
  }

  // One round: every push chunk, then every pull chunk, then all the answers.
  void round(std::span<const float> grad, std::span<float> out) {
    const auto* g = reinterpret_cast<const char*>(grad.data());
    for (const auto& p : pieces_) {
      raw_header h;
      h.kind = raw_header::push;
      h.offset = p.server_offset;
      h.bytes = p.bytes;
      auto& s = socks_[static_cast<std::size_t>(p.server)];
      s.send(zmq::buffer(&h, sizeof h), zmq::send_flags::sndmore);
      // zero-copy, as gradus' client sends chunks >= 64 KiB; the gradient outlives the context
      zmq::message_t body(const_cast<char*>(g + p.var_offset), p.bytes, nullptr, nullptr);
      s.send(body, zmq::send_flags::none);
    }
    for (const auto& p : pieces_) {
      raw_header h;
      h.kind = raw_header::pull;
      h.offset = p.server_offset;
      h.bytes = p.bytes;
      socks_[static_cast<std::size_t>(p.server)].send(zmq::buffer(&h, sizeof h), zmq::send_flags::none);
    }
    expect_ = static_cast<int>(2 * pieces_.size());
    receive(std::as_writable_bytes(out));
  }

  // The first element of `out` that is not what the servers hold (each server's buffer
  // holds the pattern from its own offset 0), if any.
  std::optional<std::size_t> first_wrong(std::span<const float> out) const {
    for (const auto& p : pieces_)
      for (std::size_t j = 0; j < p.bytes / sizeof(float); ++j)
        if (out[p.var_offset / sizeof(float) + j] != pattern(p.server_offset / sizeof(float) + j)) return p.var_offset / sizeof(float) + j;
    return std::nullopt;
  }

 private:
  // Reads answers until expect_ have come; a pull's data goes to out at its piece's place.
  void receive(std::span<std::byte> out, clk::duration deadline = io_deadline) {
    const auto until = clk::now() + deadline;
    std::vector<zmq::pollitem_t> items;
    for (auto& s : socks_) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
    while (expect_ > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - clk::now());
      if (left.count() <= 0)
        throw std::runtime_error("raw client: " + std::to_string(expect_) + " answers missing after " +
                                 std::to_string(std::chrono::duration_cast<std::chrono::seconds>(deadline).count()) + " s");
      zmq::poll(items.data(), items.size(), left);
      for (std::size_t k = 0; k < socks_.size(); ++k) {
        if (!(items[k].revents & ZMQ_POLLIN)) continue;
        for (int budget = 0; budget < 1024; ++budget) {
          zmq::message_t hdr;
          if (!socks_[k].recv(hdr, zmq::recv_flags::dontwait)) break;
          raw_header h;
          if (hdr.size() != sizeof h) die("raw client: a header of " + std::to_string(hdr.size()) + " bytes");
          std::memcpy(&h, hdr.data(), sizeof h);
          if (h.kind == raw_header::data) {
            zmq::message_t body;
            (void)socks_[k].recv(body, zmq::recv_flags::none);
            const auto it = std::find_if(pieces_.begin(), pieces_.end(), [&](const piece& p) {
              return p.server == static_cast<int>(k) && p.server_offset == h.offset;
            });
            if (it == pieces_.end() || body.size() != it->bytes) die("raw client: an unexpected pull answer");
            std::memcpy(out.data() + it->var_offset, body.data(), body.size());
          }
          --expect_;
        }
      }
    }
  }

  zmq::context_t ctx_{1};
  std::vector<zmq::socket_t> socks_;
  std::vector<piece> pieces_;
  int expect_ = 0;
};

// ---- processes -----------------------------------------------------------------------------

struct child {
  pid_t pid = -1;
  std::string endpoint;
  bool gradus = false;
};

// Forks and execs this program as `--serve <what> <index>`; returns its pid and the
// endpoint it printed (within 10 s).
struct curve_keys {
  g::ps::key_pair server, worker;
};

child spawn(const char* what, int index, const std::optional<curve_keys>& curve) {
  int fds[2];
  if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    ::dup2(fds[1], 1);
    ::close(fds[0]);
    ::close(fds[1]);
    // the gradus servers' optimizer pass runs on OpenMP threads; --server-omp-threads sets how many
    if (const char* t = std::getenv("PS_BENCH_SERVER_OMP_THREADS"); t && std::strcmp(what, "gradus") == 0) ::setenv("OMP_NUM_THREADS", t, 1);
    if (curve) {
      ::setenv("PS_BENCH_CURVE_SERVER_SECRET", curve->server.secret_key.c_str(), 1);
      ::setenv("PS_BENCH_CURVE_WORKER_PUBLIC", curve->worker.public_key.c_str(), 1);
    }
    const std::string idx = std::to_string(index);
    const char* argv[] = {"ps_bench", "--serve", what, idx.c_str(), nullptr};
    ::execv("/proc/self/exe", const_cast<char* const*>(argv));
    ::_exit(127);
  }
  ::close(fds[1]);
  std::string line;
  const auto until = clk::now() + 10s;
  while (line.find('\n') == std::string::npos && clk::now() < until) {
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    line.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (line.find('\n') == std::string::npos) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    throw std::runtime_error(std::string("the ") + what + " server " + std::to_string(index) + " did not say where it listens within 10 s");
  }
  return {pid, line.substr(0, line.find('\n')), std::strcmp(what, "gradus") == 0};
}

// Waits up to 10 s for each child to end by itself, then kills and reaps the rest.
void reap(std::vector<child>& cs) {
  const auto until = clk::now() + 10s;
  for (auto& c : cs) {
    while (c.pid > 0) {
      int status = 0;
      const pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::fprintf(stderr, "ps_bench: server process %d ended abnormally (status %d)\n", c.pid, status);
        c.pid = -1;
      } else if (clk::now() > until) {
        std::fprintf(stderr, "ps_bench: server process %d did not stop; killing it\n", c.pid);
        ::kill(c.pid, SIGKILL);
        ::waitpid(c.pid, nullptr, 0);
        c.pid = -1;
      } else {
        std::this_thread::sleep_for(10ms);
      }
    }
  }
}

// CPU ticks: the whole machine's, and those of this process and its server children, so
// that what other processes took while a configuration ran can be told.
struct cpu_ticks {
  long long total = 0, busy = 0, ours = 0;
};
long long process_ticks(pid_t pid) {
  std::ifstream ss("/proc/" + (pid > 0 ? std::to_string(pid) : std::string("self")) + "/stat");
  std::string line;
  std::getline(ss, line);
  if (line.empty()) return 0;
  std::istringstream rest(line.substr(line.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 13; ++i) rest >> field;
  long long ut = 0, st = 0;
  rest >> ut >> st;
  return ut + st;
}
cpu_ticks sample_cpu(const std::vector<child>& cs) {
  cpu_ticks t;
  std::ifstream st("/proc/stat");
  std::string cpu;
  long long v[8] = {};
  st >> cpu;
  for (auto& x : v) st >> x;
  for (auto x : v) t.total += x;
  t.busy = t.total - v[3] - v[4];
  t.ours = process_ticks(0);
  for (const auto& c : cs) t.ours += process_ticks(c.pid);
  return t;
}
// Other processes' CPU between a and b, in cores (total ticks count every core).
double others_cores(const cpu_ticks& a, const cpu_ticks& b) {
  const double dt = static_cast<double>(b.total - a.total);
  const double others = static_cast<double>((b.busy - a.busy) - (b.ours - a.ours));
  return dt > 0 ? std::max(0.0, others / dt * static_cast<double>(std::thread::hardware_concurrency())) : 0.0;
}

std::string cpu_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      auto v = line.substr(line.find(':') + 1);
      v.erase(0, v.find_first_not_of(' '));
      return v;
    }
  return "unknown CPU";
}
std::string loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---- one configuration ---------------------------------------------------------------------

struct result {
  int servers = 0;
  bool curve = false;
  std::size_t bytes = 0;
  int reps = 0;
  double s_gradus = 0, s_raw = 0;  // median seconds per round
  double others = 0;               // other processes' CPU while it ran, cores
  // CPU seconds per round (all threads: ZeroMQ's I/O threads and OpenMP's included) of the
  // worker process while it ran each side, and of each side's server processes together
  double cpu_worker_gradus = 0, cpu_worker_raw = 0, cpu_servers_gradus = 0, cpu_servers_raw = 0;
  double gbps(double s) const { return 2.0 * static_cast<double>(bytes) / s / 1e9; }
  double ratio() const { return s_raw / s_gradus; }
};

result measure_with(std::vector<child>& kids, int servers, std::size_t bytes, std::size_t chunk, const std::optional<curve_keys>& curve,
                    int rounds, int warmup);

// Starts the servers, measures, and stops and reaps them, also when the measurement fails.
result measure(int servers, std::size_t bytes, std::size_t chunk, const std::optional<curve_keys>& curve, int rounds, int warmup) {
  std::vector<child> kids;
  try {
    auto r = measure_with(kids, servers, bytes, chunk, curve, rounds, warmup);
    reap(kids);
    return r;
  } catch (...) {
    for (auto& c : kids)
      if (c.pid > 0) ::kill(c.pid, SIGKILL);
    reap(kids);
    throw;
  }
}

result measure_with(std::vector<child>& kids, int servers, std::size_t bytes, std::size_t chunk, const std::optional<curve_keys>& curve,
                    int rounds, int warmup) {
  std::vector<std::string> gradus_eps, raw_eps;
  for (int k = 0; k < servers; ++k) {
    kids.push_back(spawn("gradus", k, curve));
    gradus_eps.push_back(kids.back().endpoint);
    kids.push_back(spawn("raw", k, curve));
    raw_eps.push_back(kids.back().endpoint);
  }
  const std::size_t n = bytes / sizeof(float);
  std::vector<float> init(n), grad(n), out_g(n, 0.f), out_r(n, 0.f);
  for (std::size_t i = 0; i < n; ++i) {
    init[i] = pattern(i);
    grad[i] = static_cast<float>(i % 7) - 3.0f;
  }
  result res;
  res.servers = servers;
  res.curve = curve.has_value();
  res.bytes = bytes;
  res.reps = static_cast<int>(std::max<std::size_t>(1, 64 * MiB / bytes));
  std::vector<double> tg, tr;
  cpu_ticks c0, c1;
  {
    g::ps_options o;
    o.servers = gradus_eps;
    o.rank = 0;
    o.world_size = 1;
    o.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(io_deadline);
    o.chunk_bytes = chunk;
    if (curve) o.curve = g::ps::curve_client_config{curve->worker, {curve->server.public_key}};
    g::parameter_server<g::ps_async> ps(o);
    ps.set_optimizer("sgd", {});
    ps.set_learning_rate(0.0);
    ps.initialize("w", std::span<const float>(init));
    raw_client raw(raw_eps, bytes, o.chunk_bytes, o.curve);

    const auto run_gradus = [&] {
      for (int i = 0; i < res.reps; ++i) {
        const auto a = ps.push_async("w", std::span<const float>(grad));
        const auto b = ps.pull_async("w", std::span<float>(out_g));
        ps.wait(a);
        ps.wait(b);
      }
    };
    const auto run_raw = [&] {
      for (int i = 0; i < res.reps; ++i) raw.round(grad, out_r);
    };
    const auto timed = [&](auto&& f, double& cpu) {
      timespec c0{}, c1{};
      ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
      const auto t0 = clk::now();
      f();
      const auto t1 = clk::now();
      ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
      cpu += static_cast<double>(c1.tv_sec - c0.tv_sec) + 1e-9 * static_cast<double>(c1.tv_nsec - c0.tv_nsec);
      return std::chrono::duration<double>(t1 - t0).count() / res.reps;
    };
    for (int w = 0; w < warmup; ++w) {
      run_gradus();
      run_raw();
    }
    const auto servers_ticks = [&](bool gradus) {
      long long t = 0;
      for (const auto& c : kids)
        if (c.gradus == gradus) t += process_ticks(c.pid);
      return t;
    };
    const long long sg0 = servers_ticks(true), sr0 = servers_ticks(false);
    c0 = sample_cpu(kids);
    for (int r = 0; r < rounds; ++r) {
      if (r % 2 == 0) {
        tg.push_back(timed(run_gradus, res.cpu_worker_gradus));
        tr.push_back(timed(run_raw, res.cpu_worker_raw));
      } else {
        tr.push_back(timed(run_raw, res.cpu_worker_raw));
        tg.push_back(timed(run_gradus, res.cpu_worker_gradus));
      }
    }
    c1 = sample_cpu(kids);
    const double tick = 1.0 / static_cast<double>(::sysconf(_SC_CLK_TCK)), all_rounds = static_cast<double>(rounds) * res.reps;
    res.cpu_servers_gradus = static_cast<double>(servers_ticks(true) - sg0) * tick / all_rounds;
    res.cpu_servers_raw = static_cast<double>(servers_ticks(false) - sr0) * tick / all_rounds;
    res.cpu_worker_gradus /= all_rounds;
    res.cpu_worker_raw /= all_rounds;
    for (std::size_t i = 0; i < n; ++i) {
      if (out_g[i] != init[i]) die("gradus pulled " + std::to_string(out_g[i]) + " at " + std::to_string(i) + "; expected " + std::to_string(init[i]));
    }
    if (const auto bad = raw.first_wrong(out_r)) die("the raw loop pulled a wrong value at element " + std::to_string(*bad));
  }  // the chief's goodbye ends the gradus servers, the raw client's quit the raw ones
  res.s_gradus = median(tg);
  res.s_raw = median(tr);
  res.others = others_cores(c0, c1);
  return res;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::vector<std::size_t> parse_list(const std::string& s) {
  std::vector<std::size_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) v.push_back(std::stoull(item));
  return v;
}

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.size() >= 2 && args[0] == "--serve") {
    const int index = args.size() >= 3 ? std::stoi(args[2]) : 0;
    if (args[1] == "gradus") return serve_gradus(index);
    if (args[1] == "raw") return serve_raw();
    die("--serve gradus|raw");
  }
  int rounds = 15, warmup = 3;
  bool json = false;
  std::string server_omp;  // OMP_NUM_THREADS for the gradus server processes; empty: inherited
  std::string curve_mode = "both";
  std::vector<std::size_t> sizes{1, 64}, server_counts{1, 2};
  std::size_t chunk = MiB;  // ps_options::chunk_bytes' default
  for (std::size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    const auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) die(a + " needs a value");
      return args[++i];
    };
    if (a == "--json") json = true;
    else if (a == "--rounds") rounds = std::stoi(value());
    else if (a == "--warmup") warmup = std::stoi(value());
    else if (a == "--sizes-mib") sizes = parse_list(value());
    else if (a == "--servers") server_counts = parse_list(value());
    else if (a == "--chunk-kib") chunk = std::stoull(value()) << 10;
    else if (a == "--curve") curve_mode = value();
    else if (a == "--server-omp-threads") {
      server_omp = value();
      if (server_omp.find_first_not_of("0123456789") != std::string::npos || std::stoi(server_omp) < 1) die("--server-omp-threads: a count >= 1");
    } else if (a == "--help" || a == "-h") {
      std::printf("ps_bench [--rounds N (15)] [--warmup N (3)] [--sizes-mib 1,64] [--servers 1,2] [--curve off|on|both (both)]\n"
                  "         [--chunk-kib 1024] [--server-omp-threads N] [--json]\n");
      return 0;
    } else {
      die("unknown argument '" + a + "' (--help)");
    }
  }
  if (rounds < 1 || warmup < 0 || sizes.empty() || server_counts.empty()) die("nothing to run");
  for (const auto v : sizes)
    if (v < 1 || v > 1024) die("--sizes-mib: each size is 1 ... 1024 MiB");
  for (const auto v : server_counts)
    if (v < 1 || v > 16) die("--servers: each count is 1 ... 16");
  // from 64 KiB gradus' client sends chunks zero-copy, as the raw client always does
  if (chunk < (64u << 10) || chunk > 64 * MiB) die("--chunk-kib: 64 ... 65536");
  if (curve_mode != "off" && curve_mode != "on" && curve_mode != "both") die("--curve: off, on or both");
  if (!server_omp.empty()) ::setenv("PS_BENCH_SERVER_OMP_THREADS", server_omp.c_str(), 1);
  std::vector<bool> curve_modes;
  if (curve_mode != "on") curve_modes.push_back(false);
  if (curve_mode != "off") curve_modes.push_back(true);
  std::optional<curve_keys> keys;
  if (curve_mode != "off") keys = curve_keys{g::ps::generate_key_pair(), g::ps::generate_key_pair()};  // says so if libzmq has no CURVE

  const std::string cpu = cpu_name(), load_before = loadavg();
  const auto started = std::chrono::system_clock::now();
  std::vector<result> results;
  for (const auto s : server_counts)
    for (const auto mib : sizes)
      for (const bool curve : curve_modes) {
        results.push_back(measure(static_cast<int>(s), mib * MiB, chunk, curve ? keys : std::nullopt, rounds, warmup));
        if (!json) std::fprintf(stderr, "  %zu server(s), %zu MiB, CURVE %s done\n", s, mib, curve ? "on" : "off");
      }
  const std::string load_after = loadavg();
  const auto name = [](const result& r) { return std::to_string(r.bytes / MiB) + "MiB" + (r.curve ? "_curve" : ""); };

  if (json) {
    // Top-level figures are those of the first server count (1 by default), without CURVE
    // and (suffix _curve) with it; every configuration is also under "servers_N".
    std::string j = "{\"benchmark\":\"ps_bench\",\"cpu\":\"" + cpu + "\",\"cores\":" + std::to_string(std::thread::hardware_concurrency()) +
                    ",\"loadavg_before\":\"" + load_before + "\",\"loadavg_after\":\"" + load_after + "\",\"rounds\":" + std::to_string(rounds) +
                    ",\"warmup\":" + std::to_string(warmup) + ",\"chunk_bytes\":" + std::to_string(chunk) + ",\"transport\":\"tcp 127.0.0.1\"" +
                    ",\"server_omp_threads\":\"" + (server_omp.empty() ? std::string("inherited") : server_omp) + "\"" + ",\"curve\":\"" +
                    (curve_mode == "both" ? "off and on" : curve_mode) + "\",\"target_ratio\":0.8,\"top_level_servers\":" +
                    std::to_string(server_counts.front());
    double worst = 1e300;
    for (const auto& r : results) {
      worst = std::min(worst, r.ratio());
      if (r.servers != static_cast<int>(server_counts.front())) continue;
      const std::string n = std::to_string(r.bytes / MiB) + "MiB", c = r.curve ? "_curve" : "";
      j += ",\"ratio_to_raw_" + n + c + "\":" + fmt("%.4f", r.ratio()) + ",\"gbps_gradus_" + n + c + "\":" + fmt("%.4f", r.gbps(r.s_gradus)) +
           ",\"gbps_raw_" + n + c + "\":" + fmt("%.4f", r.gbps(r.s_raw));
    }
    j += ",\"ratio_to_raw_min\":" + fmt("%.4f", worst) + ",\"target_met\":" + (worst >= 0.8 ? "true" : "false");
    for (const auto s : server_counts) {
      j += ",\"servers_" + std::to_string(s) + "\":{";
      bool first = true;
      for (const auto& r : results) {
        if (r.servers != static_cast<int>(s)) continue;
        j += std::string(first ? "" : ",") + "\"" + name(r) + "\":{\"curve\":" + (r.curve ? "true" : "false") + ",\"ratio_to_raw\":" +
             fmt("%.4f", r.ratio()) + ",\"gbps_gradus\":" + fmt("%.4f", r.gbps(r.s_gradus)) + ",\"gbps_raw\":" + fmt("%.4f", r.gbps(r.s_raw)) +
             ",\"ms_gradus\":" + fmt("%.4f", r.s_gradus * 1e3) + ",\"ms_raw\":" + fmt("%.4f", r.s_raw * 1e3) +
             ",\"rounds_per_sample\":" + std::to_string(r.reps) + ",\"cpu_ms_worker_gradus\":" + fmt("%.4f", r.cpu_worker_gradus * 1e3) +
             ",\"cpu_ms_worker_raw\":" + fmt("%.4f", r.cpu_worker_raw * 1e3) + ",\"cpu_ms_servers_gradus\":" + fmt("%.4f", r.cpu_servers_gradus * 1e3) +
             ",\"cpu_ms_servers_raw\":" + fmt("%.4f", r.cpu_servers_raw * 1e3) + ",\"others_cores\":" + fmt("%.2f", r.others) + "}";
        first = false;
      }
      j += "}";
    }
    j += "}";
    std::printf("%s\n", j.c_str());
    return 0;
  }

  const std::time_t t = std::chrono::system_clock::to_time_t(started);
  char when[64];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  std::printf("# ps_bench: push+pull of one float variable, gradus::parameter_server<ps_async> (SGD, lr 0) against raw cppzmq\n");
  std::printf("%s, %s, %u cores; tcp 127.0.0.1, %zu KiB chunks; median of %d samples after %d warm-ups; OMP_NUM_THREADS in the servers: %s\n",
              when, cpu.c_str(), std::thread::hardware_concurrency(), chunk >> 10, rounds, warmup, server_omp.empty() ? "inherited" : server_omp.c_str());
  std::printf("load average before %s, after %s\n\n", load_before.c_str(), load_after.c_str());
  std::printf("| servers | size | CURVE | gradus ms/round | gradus GB/s | raw ms/round | raw GB/s | gradus / raw | "
              "worker CPU ms/round gradus / raw | servers' CPU ms/round gradus / raw | other processes (cores) |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& r : results)
    std::printf("| %d | %zu MiB | %s | %.3f | %.2f | %.3f | %.2f | %.3f | %.3f / %.3f | %.3f / %.3f | %.2f |\n", r.servers, r.bytes / MiB,
                r.curve ? "on" : "off", r.s_gradus * 1e3, r.gbps(r.s_gradus), r.s_raw * 1e3, r.gbps(r.s_raw), r.ratio(),
                r.cpu_worker_gradus * 1e3, r.cpu_worker_raw * 1e3, r.cpu_servers_gradus * 1e3, r.cpu_servers_raw * 1e3, r.others);
  std::printf("\nGB/s = (pushed + pulled bytes) / median round time; target gradus / raw >= 0.8. CPU: all threads of the\n"
              "processes (ZeroMQ I/O, OpenMP), per round over the timed samples; servers' from /proc ticks (%ld per second).\n",
              ::sysconf(_SC_CLK_TCK));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "ps_bench: %s\n", e.what());
  return 1;
}

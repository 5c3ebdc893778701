#define BOOST_TEST_MODULE dist_ps_security
// CurveZMQ security for the parameter server (gradus/comm/net/curve.hpp), on raw
// ROUTER (server) / DEALER (client) sockets over loopback tcp, set up as the server and
// its clients set theirs up: an allowed key gets through and its messages carry its rank
// (User-Id), the bytes on the wire are not the plaintext (a tap between the two sockets),
// a client without keys, with an unknown key or with the wrong server key is refused and
// its monitor event becomes a clear text; a key allowed as worker 1 that claims rank 0 is
// caught; a CURVE server without a ZAP handler refuses everyone; libzmq consults ZAP about
// NULL connections only where a ZAP domain is set; key files and allow-lists round-trip
// and their errors name the file and line; gradus-keygen, run as a process, writes files
// the library loads. Every wait is bounded.
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gradus/comm/ps/curve_config.hpp>

extern char** environ;

namespace g = gradus;
namespace ps = gradus::ps;
using namespace std::chrono_literals;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Checks that `f` throws gradus::error whose text holds every one of `parts`.
template <class F>
void check_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    BOOST_ERROR("no error thrown; expected one with '" << *parts.begin() << "'");
  } catch (const g::error& e) {
    for (const auto& p : parts) BOOST_CHECK_MESSAGE(contains(e.what(), p), "'" << e.what() << "' does not name '" << p << "'");
  }
}

// A fresh directory, removed at the end.
struct temp_dir {
  std::string path;
  temp_dir() {
    std::string templ = (std::filesystem::temp_directory_path() / "gradus-ps-security-XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path = templ;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

void write_text(const std::string& path, const std::string& text, mode_t mode = 0644) {
  {
    std::ofstream f(path, std::ios::trunc);
    f << text;
  }
  ::chmod(path.c_str(), mode);
}

// A whole multipart message within `timeout`, or nothing.
std::optional<std::vector<zmq::message_t>> recv_within(zmq::socket_t& s, std::chrono::milliseconds timeout) {
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) <= 0) return std::nullopt;
  std::vector<zmq::message_t> parts;
  do {
    zmq::message_t m;
    if (!s.recv(m, zmq::recv_flags::dontwait)) break;
    parts.push_back(std::move(m));
  } while (parts.back().more());
  return parts;
}

// A ROUTER as the parameter server makes it, with CURVE, on a loopback port of its own.
struct curve_router {
  zmq::socket_t sock;
  std::string endpoint;
  curve_router(zmq::context_t& ctx, const ps::key_pair& keys) : sock(ctx, zmq::socket_type::router) {
    sock.set(zmq::sockopt::linger, 0);
    ps::make_curve_server(sock, keys);
    sock.bind("tcp://127.0.0.1:0");
    endpoint = sock.get(zmq::sockopt::last_endpoint);
  }
};

// A DEALER as a worker makes it: CURVE client when given keys, NULL otherwise.
zmq::socket_t dealer(zmq::context_t& ctx, const ps::key_pair* keys, const std::string& server_public_key) {
  zmq::socket_t d(ctx, zmq::socket_type::dealer);
  d.set(zmq::sockopt::linger, 0);
  d.set(zmq::sockopt::reconnect_ivl, 50);
  if (keys) ps::make_curve_client(d, *keys, server_public_key);
  return d;
}

// A socket's monitor (set up before connect/bind so that it sees every event), stopped
// before its reader closes (libzmq 4.3 leaks events it could not deliver).
struct monitor {
  zmq::socket_t* watched;
  zmq::socket_t reader;
  struct event {
    std::uint16_t id;
    std::uint32_t value;
  };
  std::vector<event> seen;
  monitor(zmq::context_t& ctx, zmq::socket_t& s, int events) : watched(&s), reader(ctx, zmq::socket_type::pair) {
    static std::atomic<int> counter{0};
    const std::string ep = "inproc://test-ps-security-monitor-" + std::to_string(counter++);
    if (zmq_socket_monitor(s.handle(), ep.c_str(), events) != 0) throw zmq::error_t();
    reader.set(zmq::sockopt::linger, 0);
    reader.connect(ep);
  }
  ~monitor() { (void)zmq_socket_monitor(watched->handle(), nullptr, 0); }
  // Reads events until one satisfies `want` or `timeout` passes.
  std::optional<event> wait_for(const std::function<bool(const event&)>& want, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      auto msg = recv_within(reader, left);
      if (!msg || msg->empty() || (*msg)[0].size() < 6) continue;
      event e{};
      std::memcpy(&e.id, (*msg)[0].data(), 2);
      std::memcpy(&e.value, static_cast<const char*>((*msg)[0].data()) + 2, 4);
      seen.push_back(e);
      if (want(e)) return e;
    }
  }
};

// A TCP relay between a client and a server that keeps every byte it passes: what an
// eavesdropper on the network would read.
class tcp_tap {
 public:
  explicit tcp_tap(int target_port) : target_port_(target_port) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listen_fd_, 4) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("tcp_tap: cannot listen");
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~tcp_tap() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  std::string captured() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_;
  }

 private:
  void run() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int client = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(target_port_));
      if (server >= 0 && ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) relay(client, server);
      if (server >= 0) ::close(server);
      ::close(client);
    }
  }
  void relay(int a, int b) {
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{a, POLLIN, 0}, {b, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int k = 0; k < 2; ++k) {
        if (!(p[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(p[k].fd, buf, sizeof buf);
        if (n <= 0) return;
        {
          std::lock_guard<std::mutex> lock(mu_);
          bytes_.append(buf, static_cast<std::size_t>(n));
        }
        for (ssize_t at = 0; at < n;) {
          const ssize_t w = ::write(p[1 - k].fd, buf + at, static_cast<std::size_t>(n - at));
          if (w <= 0) return;
          at += w;
        }
      }
    }
  }
  int target_port_, listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::string bytes_;
};

int port_of(const std::string& endpoint) { return std::stoi(endpoint.substr(endpoint.rfind(':') + 1)); }

bool handshake_failed(const monitor::event& e) {
  return e.id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH || e.id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL || e.id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL;
}

// Keys made once for the whole module (key generation is cheap, but fixed keys make a
// failure easier to read).
struct keys {
  ps::key_pair server = ps::generate_key_pair(), w0 = ps::generate_key_pair(), w1 = ps::generate_key_pair(),
               tool = ps::generate_key_pair(), stranger = ps::generate_key_pair();
  ps::allow_list allowed() const {
    ps::allow_list a;
    a.allow(w0.public_key, 0);
    a.allow(w1.public_key, 1);
    a.allow(tool.public_key, ps::any_rank);
    return a;
  }
};
const keys& K() {
  static const keys k;
  return k;
}

}  // namespace

// (a) Allowed keys get through; each message carries the rank its key is listed for, and
// the routing-id frame (made by the ROUTER) carries none.
BOOST_AUTO_TEST_CASE(allowed_client_gets_through_with_its_rank) {
  zmq::context_t ctx(1);
  ps::zap_handler zap(ctx, K().allowed());
  curve_router server(ctx, K().server);
  const std::vector<std::pair<const ps::key_pair*, int>> clients = {{&K().w0, 0}, {&K().w1, 1}, {&K().tool, ps::any_rank}};
  for (const auto& [kp, rank] : clients) {
    auto d = dealer(ctx, kp, K().server.public_key);
    d.connect(server.endpoint);
    const std::string text = "hello from rank " + std::to_string(rank);
    d.send(zmq::buffer(text), zmq::send_flags::none);
    auto got = recv_within(server.sock, 10s);
    BOOST_REQUIRE_MESSAGE(got, "an allowed client's message did not arrive within 10 s");
    BOOST_REQUIRE_EQUAL(got->size(), 2u);
    BOOST_CHECK_EQUAL((*got)[1].to_string(), text);
    BOOST_CHECK_EQUAL(std::string((*got)[1].gets("User-Id")), rank == ps::any_rank ? "worker:*" : "worker:" + std::to_string(rank));
    BOOST_CHECK(ps::rank_from_user_id((*got)[1]) == std::optional<int>(rank));
    BOOST_CHECK(!ps::rank_from_user_id((*got)[0]));  // the routing id: no metadata
    BOOST_CHECK_EQUAL(std::string((*got)[1].gets("Peer-Address")), "127.0.0.1");
    // and the answer comes back
    server.sock.send((*got)[0], zmq::send_flags::sndmore);
    server.sock.send(zmq::buffer(std::string("ok")), zmq::send_flags::none);
    auto answer = recv_within(d, 10s);
    BOOST_REQUIRE(answer);
    BOOST_CHECK_EQUAL((*answer)[0].to_string(), "ok");
  }
  BOOST_CHECK_EQUAL(zap.accepted(), 3u);
  BOOST_CHECK_EQUAL(zap.refused(), 0u);
}

// (a) The bytes between an allowed client and the server are not the plaintext; the same
// tap between NULL-mechanism sockets does read it (the check can fail).
BOOST_AUTO_TEST_CASE(traffic_is_encrypted_on_the_wire) {
  const std::string secret = "gradient-bytes-0123456789-the-eavesdropper-must-not-read-this";
  const auto exchange = [&](bool curve) {
    zmq::context_t ctx(1);
    std::optional<ps::zap_handler> zap;
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    if (curve) {
      zap.emplace(ctx, K().allowed());
      ps::make_curve_server(router, K().server);
    }
    router.bind("tcp://127.0.0.1:0");
    tcp_tap tap(port_of(router.get(zmq::sockopt::last_endpoint)));
    auto d = dealer(ctx, curve ? &K().w0 : nullptr, K().server.public_key);
    d.connect("tcp://127.0.0.1:" + std::to_string(tap.port()));
    d.send(zmq::buffer(secret), zmq::send_flags::none);
    auto got = recv_within(router, 10s);
    BOOST_REQUIRE_MESSAGE(got, "the message did not arrive through the tap within 10 s");
    BOOST_CHECK_EQUAL(got->back().to_string(), secret);
    router.send((*got)[0], zmq::send_flags::sndmore);
    router.send(zmq::buffer(secret + "-reply"), zmq::send_flags::none);
    BOOST_REQUIRE(recv_within(d, 10s));
    return tap.captured();
  };
  const std::string plain = exchange(false), encrypted = exchange(true);
  BOOST_CHECK(contains(plain, secret));  // the tap sees plaintext where there is some
  BOOST_CHECK(contains(encrypted, "CURVE"));  // the greeting names the mechanism
  BOOST_CHECK_MESSAGE(!contains(encrypted, secret) && !contains(encrypted, "-reply"), "the plaintext crossed the wire with CURVE");
  BOOST_CHECK_GT(encrypted.size(), secret.size());
}

// (a) A client without keys (NULL mechanism) cannot talk to a CURVE server: the greetings'
// mechanisms differ, and its monitor says so.
BOOST_AUTO_TEST_CASE(client_without_keys_is_refused) {
  zmq::context_t ctx(1);
  ps::zap_handler zap(ctx, K().allowed());
  curve_router server(ctx, K().server);
  auto d = dealer(ctx, nullptr, "");
  monitor mon(ctx, d, ps::handshake_failure_events);
  d.connect(server.endpoint);
  d.send(zmq::buffer(std::string("rank 0 here, no keys")), zmq::send_flags::none);
  const auto e = mon.wait_for(handshake_failed, 10s);
  BOOST_REQUIRE_MESSAGE(e, "no handshake failure event within 10 s");
  BOOST_CHECK_EQUAL(e->id, ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
  BOOST_CHECK_EQUAL(e->value, static_cast<std::uint32_t>(ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH));
  const auto text = ps::describe_handshake_failure(e->id, e->value, server.endpoint);
  BOOST_REQUIRE(text);
  BOOST_TEST_MESSAGE(*text);
  BOOST_CHECK(contains(*text, server.endpoint) && contains(*text, "CURVE"));
  BOOST_CHECK(!recv_within(server.sock, 500ms));
  BOOST_CHECK_EQUAL(zap.accepted() + zap.refused(), 0u);  // never got as far as ZAP
}

// (b) A key not in the allow-list: nothing gets through, the client's monitor sees the ZAP
// refusal (400) and describe_handshake_failure explains it; the server side sees it too,
// the handler counted it and remembers the key, and reports it once however often the
// client reconnects.
BOOST_AUTO_TEST_CASE(unknown_key_is_refused_and_described) {
  zmq::context_t ctx(1);
  ps::zap_handler zap(ctx, K().allowed());
  curve_router server(ctx, K().server);
  monitor server_mon(ctx, server.sock, ps::handshake_failure_events);
  auto d = dealer(ctx, &K().stranger, K().server.public_key);
  monitor mon(ctx, d, ps::handshake_failure_events);
  d.connect(server.endpoint);
  d.send(zmq::buffer(std::string("let me in")), zmq::send_flags::none);
  const auto e = mon.wait_for(handshake_failed, 10s);
  BOOST_REQUIRE_MESSAGE(e, "no handshake failure event within 10 s");
  BOOST_CHECK_EQUAL(e->id, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  BOOST_CHECK_EQUAL(e->value, 400u);
  const auto text = ps::describe_handshake_failure(e->id, e->value, server.endpoint);
  BOOST_REQUIRE(text);
  BOOST_TEST_MESSAGE(*text);
  BOOST_CHECK(contains(*text, server.endpoint) && contains(*text, "allow-list") && contains(*text, "GRADUS_PS_CURVE_ALLOW"));
  const auto se = server_mon.wait_for(handshake_failed, 10s);
  BOOST_REQUIRE(se);
  BOOST_CHECK_EQUAL(se->id, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
  BOOST_CHECK_EQUAL(se->value, 400u);
  BOOST_CHECK(!recv_within(server.sock, 500ms));
  BOOST_CHECK_EQUAL(zap.accepted(), 0u);
  BOOST_CHECK_GE(zap.refused(), 1u);
  const auto last = zap.last_refusal();
  BOOST_REQUIRE(last);
  BOOST_CHECK_EQUAL(last->public_key, K().stranger.public_key);
  BOOST_CHECK_EQUAL(last->address, "127.0.0.1");
  BOOST_CHECK_EQUAL(last->mechanism, "CURVE");
  BOOST_CHECK_EQUAL(last->reason, "key not in the allow-list");
  const auto fresh = zap.take_new_refusals();
  BOOST_REQUIRE_EQUAL(fresh.size(), 1u);
  BOOST_CHECK_EQUAL(fresh[0].public_key, K().stranger.public_key);
  // libzmq does not retry a connection refused by ZAP: one refusal so far
  std::this_thread::sleep_for(300ms);
  BOOST_CHECK_EQUAL(zap.refused(), 1u);
  // the same key again (a second connection): counted, but not reported anew
  auto d2 = dealer(ctx, &K().stranger, K().server.public_key);
  monitor mon2(ctx, d2, ps::handshake_failure_events);
  d2.connect(server.endpoint);
  d2.send(zmq::buffer(std::string("let me in, again")), zmq::send_flags::none);
  BOOST_REQUIRE(mon2.wait_for(handshake_failed, 10s));
  BOOST_CHECK_EQUAL(zap.refused(), 2u);
  BOOST_CHECK(zap.take_new_refusals().empty());
  BOOST_CHECK_EQUAL(zap.last_refusal()->times, 2u);
  BOOST_CHECK(!recv_within(server.sock, 300ms));
}

// (c) A key allowed as worker 1 that writes "rank 0" in its payload (and names itself
// "worker-0" as its routing id) is still worker 1 to the server, which can refuse the claim.
BOOST_AUTO_TEST_CASE(allowed_key_claiming_another_rank_is_caught) {
  zmq::context_t ctx(1);
  ps::zap_handler zap(ctx, K().allowed());
  curve_router server(ctx, K().server);
  auto d = dealer(ctx, &K().w1, K().server.public_key);
  d.set(zmq::sockopt::routing_id, "worker-0");  // a self-declared identity counts for nothing
  d.connect(server.endpoint);
  d.send(zmq::buffer(std::string("rank 0")), zmq::send_flags::none);
  auto got = recv_within(server.sock, 10s);
  BOOST_REQUIRE(got);
  const std::string payload = (*got)[1].to_string();
  BOOST_REQUIRE_EQUAL(payload, "rank 0");
  const int claimed = std::stoi(payload.substr(5));
  const auto authenticated = ps::rank_from_user_id((*got)[1]);
  BOOST_CHECK(authenticated == std::optional<int>(1));
  BOOST_CHECK(!ps::may_act_as(authenticated, claimed));
  BOOST_CHECK(ps::may_act_as(authenticated, 1));
  const std::string why = ps::rank_claim_refusal(authenticated, claimed, "127.0.0.1");
  BOOST_TEST_MESSAGE(why);
  BOOST_CHECK(contains(why, "allowed as worker 1") && contains(why, "claims to be worker 0") && contains(why, "127.0.0.1"));
  BOOST_CHECK(ps::rank_claim_refusal(authenticated, 1).empty());
  // an "any rank" key may act as every worker; an unauthenticated connection as none
  BOOST_CHECK(ps::may_act_as(ps::any_rank, 0) && ps::may_act_as(ps::any_rank, 7));
  BOOST_CHECK(!ps::may_act_as(std::nullopt, 0));
  BOOST_CHECK(contains(ps::rank_claim_refusal(std::nullopt, 0), "without an authenticated CURVE key"));
}

// A client given another server public key than the server's: refused, and described as such.
BOOST_AUTO_TEST_CASE(wrong_server_key_is_described) {
  zmq::context_t ctx(1);
  ps::zap_handler zap(ctx, K().allowed());
  curve_router server(ctx, K().server);
  monitor server_mon(ctx, server.sock, ps::handshake_failure_events);
  auto d = dealer(ctx, &K().w0, K().stranger.public_key);
  monitor mon(ctx, d, ps::handshake_failure_events);
  d.connect(server.endpoint);
  d.send(zmq::buffer(std::string("hello")), zmq::send_flags::none);
  const auto e = mon.wait_for(handshake_failed, 10s);
  BOOST_REQUIRE_MESSAGE(e, "no handshake failure event within 10 s");
  const auto text = ps::describe_handshake_failure(e->id, e->value, server.endpoint);
  BOOST_REQUIRE(text);
  BOOST_TEST_MESSAGE("event " << e->id << " value " << e->value << ": " << *text);
  BOOST_CHECK(contains(*text, "GRADUS_PS_CURVE_SERVER_PUB") && contains(*text, server.endpoint));
  // libzmq retries such a connection: the client sees the failure again and again (a
  // client gives up after a few, with that text)
  BOOST_CHECK_EQUAL(e->id, ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL);
  BOOST_CHECK(mon.wait_for(handshake_failed, 10s) && mon.wait_for(handshake_failed, 10s));
  const auto se = server_mon.wait_for(handshake_failed, 10s);
  BOOST_REQUIRE(se);
  BOOST_CHECK_EQUAL(se->id, ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL);
  BOOST_CHECK_EQUAL(se->value, static_cast<std::uint32_t>(ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC));
  BOOST_CHECK(!recv_within(server.sock, 500ms));
  BOOST_CHECK_EQUAL(zap.accepted() + zap.refused(), 0u);
}

// Failing closed: a CURVE server whose context has no ZAP handler refuses even an allowed
// key (libzmq alone would accept any key); once a handler runs, the same client gets in.
BOOST_AUTO_TEST_CASE(curve_server_without_zap_handler_refuses_everyone) {
  zmq::context_t ctx(1);
  curve_router server(ctx, K().server);
  auto d = dealer(ctx, &K().w0, K().server.public_key);
  monitor mon(ctx, d, ps::handshake_failure_events);
  d.connect(server.endpoint);
  d.send(zmq::buffer(std::string("before the handler")), zmq::send_flags::none);
  const auto e = mon.wait_for(handshake_failed, 10s);
  BOOST_REQUIRE_MESSAGE(e, "no handshake failure event within 10 s");
  BOOST_TEST_MESSAGE("event " << e->id << " value " << e->value << ": " << ps::describe_handshake_failure(e->id, e->value, server.endpoint).value_or("?"));
  BOOST_CHECK(!recv_within(server.sock, 500ms));
  ps::zap_handler zap(ctx, K().allowed());
  auto got = recv_within(server.sock, 10s);
  BOOST_REQUIRE_MESSAGE(got, "the client did not get in within 10 s once the handler ran");
  BOOST_CHECK_EQUAL(got->back().to_string(), "before the handler");
  BOOST_CHECK(ps::rank_from_user_id(got->back()) == std::optional<int>(0));
  BOOST_CHECK_GE(zap.accepted(), 1u);
}

// libzmq's behaviour that the design relies on: a NULL-mechanism socket without a ZAP
// domain never asks the handler (anyone gets in, unauthenticated: rank_from_user_id says
// so); with the "gradus-ps" domain it asks, and the handler refuses NULL.
BOOST_AUTO_TEST_CASE(null_mechanism_and_zap_domains) {
  zmq::context_t ctx(1);
  ps::zap_handler zap(ctx, K().allowed());
  for (const bool domain : {false, true}) {
    zmq::socket_t router(ctx, zmq::socket_type::router);
    router.set(zmq::sockopt::linger, 0);
    if (domain) router.set(zmq::sockopt::zap_domain, std::string(ps::curve_zap_domain));
    router.bind("tcp://127.0.0.1:0");
    const std::string ep = router.get(zmq::sockopt::last_endpoint);
    auto d = dealer(ctx, nullptr, "");
    monitor mon(ctx, d, ps::handshake_failure_events);
    d.connect(ep);
    d.send(zmq::buffer(std::string("null client")), zmq::send_flags::none);
    if (!domain) {
      auto got = recv_within(router, 10s);
      BOOST_REQUIRE(got);
      BOOST_CHECK(!ps::rank_from_user_id(got->back()));
      BOOST_CHECK_EQUAL(zap.accepted() + zap.refused(), 0u);
    } else {
      const auto e = mon.wait_for(handshake_failed, 10s);
      BOOST_REQUIRE(e);
      BOOST_CHECK_EQUAL(e->id, ZMQ_EVENT_HANDSHAKE_FAILED_AUTH);
      BOOST_CHECK(!recv_within(router, 500ms));
      BOOST_CHECK_GE(zap.refused(), 1u);
      BOOST_REQUIRE(zap.last_refusal());
      BOOST_CHECK_EQUAL(zap.last_refusal()->mechanism, "NULL");
      BOOST_CHECK(contains(zap.last_refusal()->reason, "CURVE only"));
      BOOST_CHECK(zap.last_refusal()->public_key.empty());
    }
  }
}

// One handler per context (the ZAP endpoint binds once); handlers in other contexts are
// independent; a handler stops promptly and frees the endpoint for the next.
BOOST_AUTO_TEST_CASE(one_zap_handler_per_context_and_prompt_stop) {
  zmq::context_t ctx(1), other(1);
  {
    ps::zap_handler a(ctx, K().allowed());
    check_error([&] { ps::zap_handler b(ctx, K().allowed()); }, {"already has a ZAP handler", "inproc://zeromq.zap.01"});
    ps::zap_handler c(other, K().allowed());
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ps::zap_handler h(ctx, K().allowed());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST_MESSAGE("20 handlers started and stopped in " << seconds << " s");
  BOOST_CHECK_LT(seconds, 2.0);
  // servers sharing a context share its handler (for the same allow-list only)
  {
    auto s1 = ps::zap_handler::for_context(ctx, K().allowed());
    auto s2 = ps::zap_handler::for_context(ctx, K().allowed());
    BOOST_CHECK_EQUAL(s1.get(), s2.get());
    BOOST_CHECK_NE(ps::zap_handler::for_context(other, K().allowed()).get(), s1.get());
    ps::allow_list fewer;
    fewer.allow(K().w0.public_key, 0);
    check_error([&] { (void)ps::zap_handler::for_context(ctx, fewer); }, {"different allow-lists", "own context"});
  }
  // and the last one's successor still answers
  ps::zap_handler h(ctx, K().allowed());
  curve_router server(ctx, K().server);
  auto d = dealer(ctx, &K().w1, K().server.public_key);
  d.connect(server.endpoint);
  d.send(zmq::buffer(std::string("x")), zmq::send_flags::none);
  auto got = recv_within(server.sock, 10s);
  BOOST_REQUIRE(got);
  BOOST_CHECK(ps::rank_from_user_id(got->back()) == std::optional<int>(1));
}

BOOST_AUTO_TEST_CASE(allow_list_file_format_and_errors) {
  temp_dir dir;
  const auto& k = K();
  const std::string good = "# workers\n\n" + k.w0.public_key + " 0   # w0.pub\n" + k.w1.public_key + "\t1\n" + k.tool.public_key + " *\n";
  write_text(dir / "allow.txt", good);
  const auto a = ps::allow_list::load(dir / "allow.txt");
  BOOST_CHECK_EQUAL(a.size(), 3u);
  BOOST_CHECK(a.rank_of(k.w0.public_key) == std::optional<int>(0));
  BOOST_CHECK(a.rank_of(k.w1.public_key) == std::optional<int>(1));
  BOOST_CHECK(a.rank_of(k.tool.public_key) == std::optional<int>(ps::any_rank));
  BOOST_CHECK(!a.rank_of(k.stranger.public_key));
  // lines written by allow_list::line read back
  const auto b = ps::allow_list::parse(ps::allow_list::line(k.w1.public_key, 3, "w1.pub") + ps::allow_list::line(k.tool.public_key, ps::any_rank), "x");
  BOOST_CHECK(b.rank_of(k.w1.public_key) == std::optional<int>(3) && b.rank_of(k.tool.public_key) == std::optional<int>(ps::any_rank));

  const std::string f = dir / "bad.txt";
  write_text(f, "# ok\n" + k.w0.public_key + " 0\n" + k.w1.public_key.substr(0, 39) + " 1\n");
  check_error([&] { (void)ps::allow_list::load(f); }, {f, "line 3", "39 characters", "40"});
  write_text(f, k.w0.public_key + " 0\n" + k.w1.public_key.substr(0, 10) + "\"" + k.w1.public_key.substr(11) + " 1\n");
  check_error([&] { (void)ps::allow_list::load(f); }, {f, "line 2", "'\"' at character 11", "not Z85"});
  write_text(f, k.w0.public_key + " one\n");
  check_error([&] { (void)ps::allow_list::load(f); }, {f, "line 1", "rank 'one'"});
  write_text(f, k.w0.public_key + "\n");
  check_error([&] { (void)ps::allow_list::load(f); }, {f, "line 1", "<public key> <rank>"});
  write_text(f, k.w0.public_key + " 0\n\n# again\n" + k.w0.public_key + " 1\n");
  check_error([&] { (void)ps::allow_list::load(f); }, {f, "line 4", "first on line 1"});
  check_error([&] { (void)ps::allow_list::load(dir / "missing.txt"); }, {dir / "missing.txt", "No such file"});
  // keys holding '#' and '=' (Z85 characters) next to comments
  std::string hash_key, eq_key;
  for (int i = 0; i < 10000 && (hash_key.empty() || eq_key.empty()); ++i) {
    const auto kp = ps::generate_key_pair();
    if (hash_key.empty() && contains(kp.public_key, "#")) hash_key = kp.public_key;
    else if (eq_key.empty() && contains(kp.public_key, "=")) eq_key = kp.public_key;
  }
  BOOST_REQUIRE(!hash_key.empty() && !eq_key.empty());
  write_text(f, "#\n# keys with '#' and '='\n" + hash_key + " 4 # four\n  " + eq_key + "  5  #\n");
  const auto h = ps::allow_list::load(f);
  BOOST_CHECK_EQUAL(h.size(), 2u);
  BOOST_CHECK(h.rank_of(hash_key) == std::optional<int>(4) && h.rank_of(eq_key) == std::optional<int>(5));
  write_text(f, "#comment without a blank\n");
  check_error([&] { (void)ps::allow_list::load(f); }, {f, "line 1", "a comment line begins with '# '"});
  write_text(f, k.w0.public_key + " 0 trailing words\n");
  check_error([&] { (void)ps::allow_list::load(f); }, {f, "line 1", "<public key> <rank>"});
  temp_dir keys_dir;
  for (const auto& key : {hash_key, eq_key}) {
    write_text(keys_dir / "k.pub", "# " + key + "\n" + key + "   # trailing\n");
    BOOST_CHECK_EQUAL(ps::load_public_key(keys_dir / "k.pub"), key);
    write_text(keys_dir / "k.pub", "public-key=" + key + "\n");
    BOOST_CHECK_EQUAL(ps::load_public_key(keys_dir / "k.pub"), key);
  }
  for (int i = 0; i < 40; ++i) {  // secret keys with '#' and '=' round-trip through the files too
    const auto kp = ps::generate_key_pair();
    ps::save_key_pair(keys_dir / "pair", kp, true);
    const auto back = ps::load_key_pair(keys_dir / "pair");
    BOOST_REQUIRE_EQUAL(back.secret_key, kp.secret_key);
    BOOST_REQUIRE_EQUAL(ps::load_public_key(keys_dir / "pair.pub"), kp.public_key);
  }
  ps::allow_list c;
  c.allow(k.w0.public_key, 0);
  check_error([&] { c.allow(k.w0.public_key, 1); }, {"listed twice"});
  check_error([&] { c.allow("short", 1); }, {"5 characters"});
}

// (d) Key files: a round trip, no replacing unless asked, modes, and errors that name the
// file: missing, truncated, not Z85, readable by others, a public key not of the secret.
BOOST_AUTO_TEST_CASE(key_files_round_trip_and_errors) {
  temp_dir dir;
  const auto kp = ps::generate_key_pair();
  BOOST_CHECK_EQUAL(kp.public_key.size(), 40u);
  BOOST_CHECK_EQUAL(kp.secret_key.size(), 40u);
  BOOST_CHECK_EQUAL(ps::public_key_of(kp.secret_key), kp.public_key);
  ps::save_key_pair(dir / "w0", kp);
  struct stat st {};
  BOOST_REQUIRE_EQUAL(::stat((dir / "w0.key").c_str(), &st), 0);
  BOOST_CHECK_EQUAL(st.st_mode & 0777, 0600u);
  BOOST_REQUIRE_EQUAL(::stat((dir / "w0.pub").c_str(), &st), 0);
  BOOST_CHECK_EQUAL(st.st_mode & 0777, 0644u);
  for (const std::string& p : {dir / "w0", dir / "w0.key"}) {
    const auto back = ps::load_key_pair(p);
    BOOST_CHECK_EQUAL(back.public_key, kp.public_key);
    BOOST_CHECK_EQUAL(back.secret_key, kp.secret_key);
  }
  BOOST_CHECK_EQUAL(ps::load_public_key(dir / "w0.pub"), kp.public_key);
  BOOST_CHECK_EQUAL(ps::load_public_key(dir / "w0.key"), kp.public_key);  // a .key names its public key too
  // no replacing unless asked
  const auto kp2 = ps::generate_key_pair();
  check_error([&] { ps::save_key_pair(dir / "w0", kp2); }, {dir / "w0.key", "exists"});
  BOOST_CHECK_EQUAL(ps::load_key_pair(dir / "w0").secret_key, kp.secret_key);
  ps::save_key_pair(dir / "w0", kp2, /*overwrite=*/true);
  BOOST_CHECK_EQUAL(ps::load_key_pair(dir / "w0").secret_key, kp2.secret_key);
  BOOST_CHECK_EQUAL(ps::load_public_key(dir / "w0.pub"), kp2.public_key);
  BOOST_REQUIRE_EQUAL(::stat((dir / "w0.key").c_str(), &st), 0);
  BOOST_CHECK_EQUAL(st.st_mode & 0777, 0600u);
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    ++files;
    BOOST_CHECK_MESSAGE(!contains(e.path().string(), ".tmp"), "a temporary file was left: " << e.path());
  }
  BOOST_CHECK_EQUAL(files, 2u);
  check_error([&] { ps::save_key_pair(dir / "bad", {kp.public_key, kp2.secret_key}); }, {"does not belong"});

  // missing
  check_error([&] { (void)ps::load_key_pair(dir / "nobody"); }, {dir / "nobody.key", "No such file", "gradus-keygen"});
  check_error([&] { (void)ps::load_public_key(dir / "nobody.pub"); }, {dir / "nobody.pub", "No such file"});
  // truncated
  write_text(dir / "cut.pub", "# a key cut short\n" + kp.public_key.substr(0, 20));
  check_error([&] { (void)ps::load_public_key(dir / "cut.pub"); }, {dir / "cut.pub", "line 2", "20 characters"});
  write_text(dir / "empty.pub", "# nothing\n");
  check_error([&] { (void)ps::load_public_key(dir / "empty.pub"); }, {dir / "empty.pub", "holds no key"});
  write_text(dir / "cut.key", "public-key = " + kp.public_key + "\nsecret-key = " + kp.secret_key.substr(0, 31), 0600);
  check_error([&] { (void)ps::load_key_pair(dir / "cut"); }, {dir / "cut.key", "line 2", "secret-key", "31 characters"});
  write_text(dir / "half.key", "public-key = " + kp.public_key + "\n", 0600);
  check_error([&] { (void)ps::load_key_pair(dir / "half"); }, {dir / "half.key", "no secret-key"});
  // not Z85
  std::string bad = kp.public_key;
  bad[5] = ',';
  write_text(dir / "comma.pub", bad + "\n");
  check_error([&] { (void)ps::load_public_key(dir / "comma.pub"); }, {dir / "comma.pub", "',' at character 6", "not Z85"});
  // a public key that is not the secret key's
  write_text(dir / "mixed.key", "public-key = " + kp.public_key + "\nsecret-key = " + kp2.secret_key + "\n", 0600);
  check_error([&] { (void)ps::load_key_pair(dir / "mixed"); }, {dir / "mixed.key", "line 1", "does not belong"});
  // readable by others
  ::chmod((dir / "w0.key").c_str(), 0644);
  check_error([&] { (void)ps::load_key_pair(dir / "w0"); }, {dir / "w0.key", "mode 0644", "chmod 600"});
  ::chmod((dir / "w0.key").c_str(), 0640);
  check_error([&] { (void)ps::load_key_pair(dir / "w0"); }, {dir / "w0.key", "mode 0640"});
  // a .pub given where the key pair is expected
  ::chmod((dir / "w0.key").c_str(), 0600);
  write_text(dir / "pubonly.key", kp.public_key + "\n", 0600);
  check_error([&] { (void)ps::load_key_pair(dir / "pubonly"); }, {dir / "pubonly.key", "line 1", "public-key = <key>"});
}

namespace {

std::string keygen_exe() {
  if (const char* e = std::getenv("GRADUS_KEYGEN")) return e;
#ifdef GRADUS_KEYGEN_EXE
  return GRADUS_KEYGEN_EXE;
#else
  return {};
#endif
}

struct run_result {
  int status = -1;
  std::string output;
};

// Runs gradus-keygen with `args`, its stdout and stderr to a file; killed after 30 s.
run_result run_keygen(const std::vector<std::string>& args, const std::string& out_file) {
  std::vector<std::string> argv_s = {keygen_exe()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  run_result r;
  if (rc != 0) {
    r.output = "posix_spawn: " + std::string(std::strerror(rc));
    return r;
  }
  const auto until = std::chrono::steady_clock::now() + 30s;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > until) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      r.output = "killed after 30 s";
      return r;
    }
    std::this_thread::sleep_for(5ms);
  }
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream f(out_file);
  r.output.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return r;
}

bool keygen_available() { return !keygen_exe().empty() && ::access(keygen_exe().c_str(), X_OK) == 0; }

}  // namespace

// (d) gradus-keygen, run as a process, writes key files and allow-lists the library loads,
// refuses to replace a key without --force and to list a key twice.
BOOST_AUTO_TEST_CASE(gradus_keygen_writes_loadable_files,
                     *boost::unit_test::precondition([](boost::unit_test::test_unit_id) {
                       return boost::test_tools::assertion_result(keygen_available());
                     })) {
  temp_dir dir;
  const std::string log = dir / "out.txt";
  auto r = run_keygen({dir / "ps"}, log);
  BOOST_REQUIRE_MESSAGE(r.status == 0, "gradus-keygen ps: " << r.status << ": " << r.output);
  const auto ps_keys = ps::load_key_pair(dir / "ps");
  BOOST_CHECK(contains(r.output, ps_keys.public_key));  // it prints the public key
  BOOST_CHECK_EQUAL(ps::load_public_key(dir / "ps.pub"), ps_keys.public_key);
  struct stat st {};
  BOOST_REQUIRE_EQUAL(::stat((dir / "ps.key").c_str(), &st), 0);
  BOOST_CHECK_EQUAL(st.st_mode & 0777, 0600u);
  r = run_keygen({dir / "ps"}, log);
  BOOST_CHECK_EQUAL(r.status, 1);
  BOOST_CHECK(contains(r.output, "exists") && contains(r.output, "--force"));
  BOOST_CHECK_EQUAL(ps::load_key_pair(dir / "ps").secret_key, ps_keys.secret_key);
  r = run_keygen({"--force", dir / "ps"}, log);
  BOOST_CHECK_EQUAL(r.status, 0);
  BOOST_CHECK_NE(ps::load_key_pair(dir / "ps").secret_key, ps_keys.secret_key);

  BOOST_REQUIRE_EQUAL(run_keygen({dir / "w0"}, log).status, 0);
  BOOST_REQUIRE_EQUAL(run_keygen({dir / "w1.key"}, log).status, 0);  // a name ending in .key names the pair
  BOOST_REQUIRE_EQUAL(run_keygen({dir / "tool"}, log).status, 0);
  const std::string list = dir / "allow.txt";
  r = run_keygen({"--allow", dir / "w0.pub", "--rank", "0", "--list", list}, log);
  BOOST_REQUIRE_MESSAGE(r.status == 0, r.output);
  BOOST_REQUIRE_EQUAL(run_keygen({"--allow", dir / "w1.pub", "--rank", "1", "--list", list}, log).status, 0);
  BOOST_REQUIRE_EQUAL(run_keygen({"--allow", dir / "tool.pub", "--rank", "*", "--list", list}, log).status, 0);
  const auto a = ps::allow_list::load(list);
  BOOST_CHECK_EQUAL(a.size(), 3u);
  BOOST_CHECK(a.rank_of(ps::load_key_pair(dir / "w0").public_key) == std::optional<int>(0));
  BOOST_CHECK(a.rank_of(ps::load_key_pair(dir / "w1").public_key) == std::optional<int>(1));
  BOOST_CHECK(a.rank_of(ps::load_key_pair(dir / "tool").public_key) == std::optional<int>(ps::any_rank));
  r = run_keygen({"--allow", dir / "w0.pub", "--rank", "1", "--list", list}, log);
  BOOST_CHECK_EQUAL(r.status, 1);
  BOOST_CHECK(contains(r.output, "already in") && contains(r.output, "rank 0"));
  r = run_keygen({"--allow", dir / "ps.pub", "--rank", "x", "--list", list}, log);
  BOOST_CHECK_EQUAL(r.status, 1);
  BOOST_CHECK(contains(r.output, "rank 'x'"));
  r = run_keygen({"--allow", dir / "ps.pub", "--list", list}, log);  // --rank missing
  BOOST_CHECK_EQUAL(r.status, 2);
  r = run_keygen({}, log);
  BOOST_CHECK_EQUAL(r.status, 2);
  BOOST_CHECK_EQUAL(ps::allow_list::load(list).size(), 3u);  // the refusals left the list alone

  // and the files work: a worker with w1's keys gets in as rank 1
  zmq::context_t ctx(1);
  ps::zap_handler zap(ctx, ps::allow_list::load(list));
  curve_router server(ctx, ps::load_key_pair(dir / "ps"));
  const auto w1 = ps::load_key_pair(dir / "w1");
  auto d = dealer(ctx, &w1, ps::load_public_key(dir / "ps.pub"));
  d.connect(server.endpoint);
  d.send(zmq::buffer(std::string("from keygen's w1")), zmq::send_flags::none);
  auto got = recv_within(server.sock, 10s);
  BOOST_REQUIRE(got);
  BOOST_CHECK(ps::rank_from_user_id(got->back()) == std::optional<int>(1));
}

BOOST_AUTO_TEST_CASE(describe_handshake_failure_texts) {
  const std::string ep = "tcp://10.0.0.3:29600";
  const auto d = [&](std::uint16_t e, std::uint32_t v) { return ps::describe_handshake_failure(e, v, ep); };
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400).value(), "allow-list"));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 400).value(), ep));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 300).value(), "temporary"));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_AUTH, 500).value(), "500"));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH).value(), "one uses CURVE"));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC).value(), "GRADUS_PS_CURVE_SERVER_PUB"));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZAP_BAD_VERSION).value(), "ZAP"));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL, ZMQ_PROTOCOL_ERROR_ZMTP_UNEXPECTED_COMMAND).value(), "0x10000001"));
  BOOST_CHECK(contains(d(ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL, ECONNRESET).value(), "GRADUS_PS_CURVE_SERVER_PUB"));
  for (const int e : {ZMQ_EVENT_CONNECTED, ZMQ_EVENT_CONNECT_DELAYED, ZMQ_EVENT_CONNECT_RETRIED, ZMQ_EVENT_DISCONNECTED,
                      ZMQ_EVENT_HANDSHAKE_SUCCEEDED, ZMQ_EVENT_CLOSED})
    BOOST_CHECK_MESSAGE(!d(static_cast<std::uint16_t>(e), 0), "event " << e << " is not a handshake failure");
}

BOOST_AUTO_TEST_CASE(configuration_from_the_environment) {
  temp_dir dir;
  const auto& k = K();
  ps::save_key_pair(dir / "ps", k.server);
  ps::save_key_pair(dir / "w0", k.w0);
  ps::save_key_pair(dir / "ps1", k.stranger);
  write_text(dir / "allow.txt", ps::allow_list::line(k.w0.public_key, 0) + ps::allow_list::line(k.w1.public_key, 1));
  write_text(dir / "empty.txt", "# nobody\n");
  std::map<std::string, std::string> env;
  const ps::env_reader read = [&](const char* name) -> const char* {
    const auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  BOOST_CHECK(!ps::curve_server_from_env(-1, read));
  BOOST_CHECK(!ps::curve_client_from_env(-1, read));
  env["GRADUS_PS_CURVE_SERVER_KEY"] = dir / "ps";
  check_error([&] { (void)ps::curve_server_from_env(-1, read); }, {"GRADUS_PS_CURVE_ALLOW is not"});
  env["GRADUS_PS_CURVE_ALLOW"] = dir / "allow.txt";
  const auto s = ps::curve_server_from_env(-1, read);
  BOOST_REQUIRE(s);
  BOOST_CHECK_EQUAL(s->keys.secret_key, k.server.secret_key);
  BOOST_CHECK(s->allowed.rank_of(k.w1.public_key) == std::optional<int>(1));
  env["GRADUS_PS_CURVE_ALLOW"] = dir / "empty.txt";
  check_error([&] { (void)ps::curve_server_from_env(-1, read); }, {dir / "empty.txt", "lists no key"});
  env.erase("GRADUS_PS_CURVE_SERVER_KEY");
  check_error([&] { (void)ps::curve_server_from_env(-1, read); }, {"GRADUS_PS_CURVE_SERVER_KEY is not"});

  env["GRADUS_PS_CURVE_CLIENT_KEY"] = dir / "w0";
  check_error([&] { (void)ps::curve_client_from_env(-1, read); }, {"GRADUS_PS_CURVE_SERVER_PUB is not"});
  env["GRADUS_PS_CURVE_SERVER_PUB"] = dir / "ps.pub";
  auto c = ps::curve_client_from_env(-1, read);
  BOOST_REQUIRE(c);
  BOOST_CHECK_EQUAL(c->keys.public_key, k.w0.public_key);
  BOOST_CHECK_EQUAL(c->server_key(0), k.server.public_key);
  BOOST_CHECK_EQUAL(c->server_key(5), k.server.public_key);  // one key for every server
  env["GRADUS_PS_CURVE_SERVER_PUB"] = dir / "ps.pub," + dir / "ps1.pub";
  c = ps::curve_client_from_env(-1, read);
  BOOST_REQUIRE(c);
  BOOST_CHECK_EQUAL(c->server_key(0), k.server.public_key);
  BOOST_CHECK_EQUAL(c->server_key(1), k.stranger.public_key);
  check_error([&] { (void)c->server_key(2); }, {"server 2", "2 given"});
  env["GRADUS_PS_CURVE_SERVER_PUB"] = dir / "ps.pub,";
  check_error([&] { (void)ps::curve_client_from_env(-1, read); }, {"empty file name"});
  env["GRADUS_PS_CURVE_SERVER_PUB"] = dir / "nope.pub";
  check_error([&] { (void)ps::curve_client_from_env(-1, read); }, {dir / "nope.pub", "No such file"});
  // one environment for every process (a launcher's): {rank} and {index} pick each one's keys
  env["GRADUS_PS_CURVE_SERVER_PUB"] = dir / "ps.pub";
  env["GRADUS_PS_CURVE_CLIENT_KEY"] = dir / "w{rank}";
  BOOST_CHECK_EQUAL(ps::curve_client_from_env(0, read)->keys.public_key, k.w0.public_key);
  check_error([&] { (void)ps::curve_client_from_env(1, read); }, {dir / "w1.key", "No such file"});
  check_error([&] { (void)ps::curve_client_from_env(-1, read); }, {"GRADUS_PS_CURVE_CLIENT_KEY", "{rank}"});
  ps::save_key_pair(dir / "server1", k.tool);
  env["GRADUS_PS_CURVE_SERVER_KEY"] = dir / "server{index}";
  env["GRADUS_PS_CURVE_ALLOW"] = dir / "allow.txt";
  BOOST_CHECK_EQUAL(ps::curve_server_from_env(1, read)->keys.public_key, k.tool.public_key);
  check_error([&] { (void)ps::curve_server_from_env(0, read); }, {dir / "server0.key"});
}

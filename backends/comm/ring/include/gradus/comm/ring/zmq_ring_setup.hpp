#pragma once
// zmq_ring's set-up: how the ring forms, before any collective runs. Its member functions
// that listen, dial, register and decide: where rank 0's rendezvous listens and what the
// other ranks dial, each rank's registration, rank 0's checks and its choice of data path
// (shared memory, direct TCP or ZeroMQ), and the data paths' own set-up. Included at the
// end of zmq_ring.hpp (the class and its running half); not a header to include alone.
// (About 580 lines: one concept, the forming of the ring, whose steps share the addresses
// and rules described here.)
//
// Rendezvous: rank 0 binds a ROUTER at the rendezvous address; every other rank connects a
// DEALER and registers "rank, world_size, hostname, machine, job, pid, launch, data
// addresses"; rank 0 checks the registrations (world sizes, transports, another job's ranks,
// two claims of one rank), picks the data transport and answers with every rank's address.
// A rank that never registers is named when the rendezvous timeout passes (the timeout, at
// least 5 s). Two claims of one rank (another job's process sent to this port): the one of
// rank 0's own launch is kept where exactly one is; otherwise both are refused and the job
// stops. A job that names no job id (ranks started by hand) on tcp listens 0.5 s more once
// every rank is there, so that a second claim just behind the first is seen.
// Each rank also binds its point-to-point socket (ring/point_to_point.hpp) beside its
// ZeroMQ data socket, on the same schemes and interface (another ephemeral port, or the ipc
// name with "-p2p" appended), and registers those addresses as "p2p+tcp://...", etc.; the
// answer carries every rank's point-to-point address of the chosen scheme too.
//
// Addresses. libzmq binds only interfaces and numeric addresses, so a tcp rendezvous host
// is resolved (getaddrinfo) first. Rank 0's rendezvous listens on
//   - a numeric address: that one, as given;
//   - "localhost", or any name that resolves only to loopback addresses: each of them
//     (127.0.0.1 and ::1 when both resolve), so that a rank reaches it whichever family
//     its own resolver prefers;
//   - this host's own name, and any other name: every interface (dual-stack "::", or
//     0.0.0.0 where the kernel has no IPv6: libzmq falls back by itself on EAFNOSUPPORT).
//     Debian maps the host's own name to 127.0.1.1 locally while other hosts reach it at
//     its real address, so what the name resolves to here is not what the others dial
//     (PyTorch's TCPStore listens on every interface for the same reason);
//   - ring_options::bind_host (GRADUS_BIND_ADDR) instead, when set: an address, a name,
//     an interface, or "*".
// The other ranks resolve the name themselves and connect to the first address their
// resolver returns (errors name it). A name that does not resolve yet, on any rank, is asked
// again (every 0.1 s, doubling to 1 s) until the timeout: a Kubernetes headless service
// publishes a pod's record only once the pod runs, so ranks started together race rank 0's
// record (torchrun's rendezvous retries likewise). Data sockets bind an ephemeral port:
// rank 0's where its rendezvous listens (advertising the rendezvous host, which every rank can reach);
// another rank's on the loopback address of the family it reaches rank 0 by when that is
// a loopback address, else on every interface, advertising its source address on the route
// to rank 0. Every socket has ZMQ_IPV6 on, so "[fd00::1]" works anywhere. ipc data sockets
// are Linux abstract sockets (ipc://@...: nothing on the filesystem, gone with the process,
// so a killed rank leaves nothing behind) unless the rendezvous is an ipc:// path. Abstract
// sockets are per network namespace: transport "auto" picks ipc only when every rank has
// the same host name, boot id and network namespace.
#include <zmq.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gradus/comm/net/address.hpp"
#include "gradus/comm/net/fd.hpp"
#include "gradus/comm/ring/zmq_ring.hpp"

namespace gradus::ring {

/// "127.0.0.1:29500", "[::1]:29500", "*:29500 (every interface)", `"ipc://@name"`
inline std::string zmq_ring::shown(const std::string& endpoint) {
  if (net::scheme_of(endpoint) != "tcp") return endpoint;
  const std::string rest = endpoint.substr(6);
  return rest.rfind("*:", 0) == 0 ? rest + " (every interface)" : rest;
}

/// "MASTER_PORT" from "MASTER_ADDR=h and MASTER_PORT=29500 (torchrun)": the variable to
/// change; "port" when the origin names none.
inline std::string zmq_ring::port_variable(const std::string& origin) {
  const auto at = origin.find("PORT=");
  if (at == std::string::npos) return "port";
  std::size_t b = at;
  while (b > 0 && (std::isupper(static_cast<unsigned char>(origin[b - 1])) || std::isdigit(static_cast<unsigned char>(origin[b - 1])) ||
                   origin[b - 1] == '_'))
    --b;
  return origin.substr(b, at + 4 - b);
}

/// Binds `s` to `endpoint`; a failure names this rank, the address and port, what it was
/// for and where it came from, and what to do.
inline void zmq_ring::bind_or_explain(zmq::socket_t& s, const std::string& endpoint, const std::string& what, const ring_options& o) {
  try {
    s.bind(endpoint);
  } catch (const zmq::error_t& e) {
    throw comm_error(listen_failure(endpoint, what, o, e.num()));
  }
}

inline std::string zmq_ring::listen_failure(const std::string& endpoint, const std::string& what, const ring_options& o, int err) const {
  std::string hint;
  if (err == EADDRINUSE) hint = " — another job on this port? pick another " + port_variable(o.origin);
  else if (err == EADDRNOTAVAIL) hint = " — it is not an address of this host (rank 0 must run on the host the rendezvous names)";
  else if (err == EACCES) hint = " — ports below 1024 need privileges; pick another " + port_variable(o.origin);
  else if (err == ENODEV) hint = " — no interface or address of this host by that name";
  return "gradus: ring_allreduce: rank " + std::to_string(rank_) + " cannot listen on " + shown(endpoint) + " (" + what + "): " +
         zmq_strerror(err) + hint;
}

/// The hosts to listen on for `host` ("*": every interface). `chosen`: the user's
/// bind_host, bound as named (an interface name goes to libzmq as it is); otherwise the
/// rendezvous host, by the rules at the top of this file.
inline std::vector<std::string> zmq_ring::listen_hosts(std::string host, bool chosen, const std::string& what) const {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "*" || net::is_numeric_host(host)) return {host};
  if (chosen && ::if_nametoindex(host.c_str()) != 0) return {host};
  int tries = 0;
  const auto r = resolve_until_timeout(host, what, tries);
  if (chosen) return r.addresses;
  const bool loopback = std::all_of(r.addresses.begin(), r.addresses.end(), net::is_loopback_address);
  if (loopback && !net::names_this_host(host)) return r.addresses;
  return {"*"};
}

/// `host`'s addresses, asked again (every 0.1 s, doubling to 1 s) while it resolves to none
/// and the timeout has not passed (the top of this file says why); then a comm_error naming
/// it, `what`, the resolver's reason and the tries. `tries`: how many it took.
inline net::resolution zmq_ring::resolve_until_timeout(const std::string& host, const std::string& what, int& tries) const {
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::milliseconds(100);
  tries = 1;
  auto r = net::resolve(host);
  while (r.addresses.empty() && std::chrono::steady_clock::now() + pause < start + setup_timeout_) {
    std::this_thread::sleep_for(pause);
    pause = std::min(2 * pause, std::chrono::milliseconds(1000));
    r = net::resolve(host);
    ++tries;
  }
  if (r.addresses.empty()) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " cannot resolve '" + host + "' (" + what +
                     "): " + r.failure + " (asked " + std::to_string(tries) + " times over " + std::to_string(waited.count()) +
                     " ms, ring_options::timeout) — is the name spelled right, and known to this host's resolver (/etc/hosts, DNS)?");
  }
  return r;
}

/// Rank != 0: the numeric tcp endpoint to dial for `endpoint` (a name resolved here, the
/// first address the resolver returns); `note` tells what a name resolved to.
inline std::string zmq_ring::dial_of(const std::string& endpoint, const std::string& what, std::string& note) const {
  note.clear();
  if (net::scheme_of(endpoint) != "tcp") return endpoint;
  const std::string host = net::tcp_host_of(endpoint);
  if (host.empty() || net::is_numeric_host(host)) return endpoint;
  int tries = 0;
  const auto r = resolve_until_timeout(host, what, tries);
  if (tries > 1) note = host + " resolved after " + std::to_string(tries) + " tries; ";
  note += host + " resolved to " + detail::join(r.addresses) + (r.addresses.size() > 1 ? "; the first one dialled" : "");
  return net::tcp_endpoint(r.addresses.front(), net::tcp_port_of(endpoint));
}

inline void zmq_ring::setup(const ring_options& o) {
  const std::string rdv = o.rendezvous;
  const std::string scheme = net::scheme_of(rdv);
  if (scheme != "tcp" && scheme != "ipc" && scheme != "inproc")
    throw error("gradus: ring_allreduce: rendezvous '" + rdv + "' must be tcp://host:port, ipc://path or inproc://name");
  std::string want = o.transport;
  // GRADUS_COMM_TRANSPORT picks the data path where the program left it to "auto" (as
  // NCCL_P2P_DISABLE / NCCL_SHM_DISABLE do): a job's launcher, or CTest running every ring
  // test over each path, need not change the program.
  if (const char* env = std::getenv("GRADUS_COMM_TRANSPORT"); want == "auto" && scheme != "inproc" && env && *env) want = env;
  if (want == "ipc") want = "zmq-ipc";  // its name before shared memory and direct TCP
  if (scheme == "inproc" && (want == "auto" || want == "zmq")) want = "inproc";
  if (want != "auto" && want != "shm" && want != "tcp" && want != "zmq" && want != "zmq-tcp" && want != "zmq-ipc" && want != "inproc")
    throw error("gradus: ring_allreduce: transport '" + want + "' must be auto, shm, tcp, zmq, zmq-tcp, zmq-ipc or inproc");
  if ((scheme == "inproc") != (want == "inproc"))
    throw error("gradus: ring_allreduce: transport '" + want + "' with rendezvous '" + rdv +
                "': inproc:// goes with inproc:// only (ranks as threads of one process)");
  if (o.segment_bytes < 64) throw error("gradus: ring_allreduce: segment_bytes " + std::to_string(o.segment_bytes) + " is below 64");
  if (o.context) {
    ctx_ = o.context;
  } else {
    if (scheme == "inproc")
      throw error("gradus: ring_allreduce: rendezvous '" + rdv + "' is inproc://: give every rank the same ring_options::context");
    own_ctx_ = std::make_unique<zmq::context_t>(std::max(1, o.io_threads));
    ctx_ = own_ctx_.get();
  }

  detail::keep_heap_for_segments(o.segment_bytes);

  // ---- where the ranks meet: rank 0 listens, the others dial (names resolved here) ----
  const std::string rdv_what = "the rendezvous, " + origin_of(o);
  if (scheme == "tcp") {
    if (rank_ == 0) {
      listen_ = o.bind_host.empty() ? listen_hosts(net::tcp_host_of(rdv), false, rdv_what)
                                    : listen_hosts(o.bind_host, true, "ring_options::bind_host for " + rdv_what);
    } else {
      rdv_dial_ = dial_of(rdv, rdv_what, rdv_note_);
    }
  } else {
    rdv_dial_ = rdv;
  }

  // ---- this rank's data socket: bound before registering ----
  pull_.emplace(data_socket(zmq::socket_type::pull));
  if (scheme != "inproc") pull_mon_ = monitor(*pull_);
  // The point-to-point socket pings no one. Every peer's messages land here, the last of
  // them (its leave) often after this rank closed it: libzmq 4.3.4 then refuses it
  // (_input_stopped), the peer's close marks the connection _io_error, and a heartbeat tick
  // before the connection is torn down calls out_event() unchecked: "Assertion failed:
  // !_io_error (src/stream_engine_base.cpp:331)", an abort. Nothing watches this socket's
  // connections: a peer's liveness is its link's PUSH socket's (point_to_point.hpp), whose
  // own heartbeats time the peer out.
  p2p_pull_.emplace(data_socket(zmq::socket_type::pull, /*heartbeats=*/false));
  std::vector<std::string> mine, p2p;
  if (scheme == "inproc") {
    const std::string ep = rdv + ".rank" + std::to_string(rank_) + "-" + net::unique_suffix();
    bind_or_explain(*pull_, ep, "its data socket", o);
    mine.push_back(ep);
    bind_or_explain(*p2p_pull_, ep + "-p2p", "its point-to-point socket", o);
    p2p.push_back("p2p+" + ep + "-p2p");
  } else {
    // ZeroMQ's sockets carry the control plane (and the data, for "zmq*"): tcp where some
    // rank may be on another host, ipc where all may share one.
    const bool want_tcp = scheme == "tcp" ? want != "zmq-ipc" && want != "shm" : want == "zmq-tcp" || want == "tcp";
    const bool want_ipc = want != "zmq-tcp";
    if (want_tcp) {
      const std::string advertised = bind_tcp_data(o, scheme);
      mine.push_back(advertised);
      // the point-to-point socket: the interface the data socket bound, another port
      const bool every = tcp_bound_host_ == "::" || tcp_bound_host_ == "0.0.0.0";
      bind_or_explain(*p2p_pull_, net::tcp_endpoint(every ? "*" : tcp_bound_host_, "*"), "its point-to-point socket, an ephemeral port", o);
      p2p.push_back("p2p+" + net::tcp_endpoint(net::tcp_host_of(advertised), net::tcp_port_of(p2p_pull_->get(zmq::sockopt::last_endpoint))));
      if (want == "auto" || want == "tcp") {
        // the direct-TCP listener: the interface the ZeroMQ socket bound, another port
        tcp_listen_.emplace(tcp_bound_host_, rank_);
        mine.push_back("tcpd://" + net::tcp_endpoint(net::tcp_host_of(advertised), std::to_string(tcp_listen_->port())).substr(6));
      }
    }
    if (want == "auto" || want == "shm") {
      shm_listen_.emplace(net::unique_suffix(), rank_);
      mine.push_back(shm_listen_->address());
    }
    if (want_ipc) {
      // Beside an ipc:// rendezvous (a path, or an abstract @name); else an abstract
      // socket, which nothing can leave behind.
      const std::string name = scheme == "ipc" ? rdv.substr(6) + ".rank" + std::to_string(rank_)
                                               : "@gradus-ring-" + net::unique_suffix() + "-rank" + std::to_string(rank_);
      bind_or_explain(*pull_, "ipc://" + name, "its ipc data socket", o);
      if (name.front() != '@') ipc_files_.push_back(name);
      mine.push_back("ipc://" + name);
      bind_or_explain(*p2p_pull_, "ipc://" + name + "-p2p", "its ipc point-to-point socket", o);
      if (name.front() != '@') ipc_files_.push_back(name + "-p2p");
      p2p.push_back("p2p+ipc://" + name + "-p2p");
    }
  }
  // the point-to-point mesh's shared-memory listeners (p2p_shm.hpp), one per advertised
  // address, bound before the rendezvous hands the addresses out
  if (scheme != "inproc")
    for (const auto& a : p2p) p2p_shm_listen_.emplace_back(a.substr(4));
  mine.insert(mine.end(), p2p.begin(), p2p.end());

  rendezvous(o, scheme, want, mine);

  // ---- connect to the right neighbour ----
  const int right = (rank_ + 1) % world_, left = (rank_ + world_ - 1) % world_;
  push_.emplace(data_socket(zmq::socket_type::push));
  if (zmq_scheme_ != "inproc") push_mon_ = monitor(*push_);
  std::string note;
  right_dial_ = dial_of(table_[right], "the data address of rank " + std::to_string(right), note);
  try {
    push_->connect(right_dial_);
  } catch (const zmq::error_t& e) {
    throw comm_error("gradus: ring_allreduce: rank " + std::to_string(rank_) + " cannot connect to rank " + std::to_string(right) +
                     "'s data address " + table_[right] + (note.empty() ? "" : " (" + note + ")") + ": " + e.what());
  }
  left_.emplace(*this, left, table_[left]);
  right_.emplace(*this, right, table_[right]);

  // ---- the data path, when it is not ZeroMQ ----
  const auto by = clock::now() + setup_timeout_;
  // More ranks on this machine than cores for this process: waiting ranks yield instead of
  // spinning (OpenMPI's mpi_yield_when_idle, which mpirun --oversubscribe sets).
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int cores = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : static_cast<int>(std::thread::hardware_concurrency());
  const bool crowded = local_ranks_ > std::max(1, cores);
  if (transport_ == "shm") {
    const std::size_t slot = std::min<std::size_t>(o.segment_bytes, shm_slot_bytes);
    path_ = std::make_unique<shm_path>(*this, rank_, left, right, *shm_listen_, data_table_[right], data_table_[left], data_table_[right],
                                       slot, crowded, by);
  } else if (transport_ == "tcp") {
    std::string tnote;
    const std::string ep = dial_of("tcp" + data_table_[right].substr(4), "the direct TCP address of rank " + std::to_string(right), tnote);
    path_ = std::make_unique<tcp_path>(*this, rank_, world_, left, right, *tcp_listen_, net::tcp_host_of(ep), net::tcp_port_of(ep),
                                       data_table_[left], data_table_[right], o.segment_bytes, crowded, by);
  }
  shm_listen_.reset();
  tcp_listen_.reset();
  for (const auto& a : data_table_) shown_table_.push_back(a.rfind("tcpd://", 0) == 0 ? "tcp" + a.substr(4) : a);
}

/// Binds the tcp data socket (an ephemeral port) and returns the address to advertise:
/// numeric, or a name every rank resolves (rank 0's rendezvous host).
inline std::string zmq_ring::bind_tcp_data(const ring_options& o, const std::string& scheme) {
  std::string what = "its data socket, an ephemeral port";
  std::vector<std::string> hosts;
  if (!o.bind_host.empty()) {
    what += ", ring_options::bind_host";
    hosts = rank_ == 0 && scheme == "tcp" ? listen_ : listen_hosts(o.bind_host, true, what);
  } else if (scheme != "tcp") {
    hosts = {"127.0.0.1"};
  } else if (rank_ == 0) {
    hosts = listen_;
  } else {
    // The loopback of the family rank 0 is dialled by, or every interface.
    const std::string to = net::tcp_host_of(rdv_dial_);
    if (net::is_loopback_address(to)) hosts = {to.find(':') != std::string::npos && to.rfind("::ffff:", 0) != 0 ? "::1" : "127.0.0.1"};
    else hosts = {"*"};
  }
  if (hosts.front() != "*") {
    bind_or_explain(*pull_, net::tcp_endpoint(hosts.front(), "*"), what, o);
    std::string bound = net::unmapped(pull_->get(zmq::sockopt::last_endpoint));
    tcp_bound_host_ = net::tcp_host_of(bound);
    return bound;
  }
  bind_or_explain(*pull_, "tcp://*:*", what, o);
  const std::string ep = pull_->get(zmq::sockopt::last_endpoint);
  tcp_bound_host_ = net::tcp_host_of(net::unmapped(ep));
  const std::string port = net::tcp_port_of(ep);
  if (scheme == "tcp" && rank_ == 0) return net::tcp_endpoint(net::tcp_host_of(o.rendezvous), port);
  // The address that routes to rank 0 (other hosts, or network namespaces that share
  // this host's name, may not resolve its name to this interface); else the name.
  std::string me = scheme == "tcp" ? net::route_source_address(net::tcp_host_of(rdv_dial_)) : std::string();
  if (me.empty()) me = net::hostname();
  return net::tcp_endpoint(me, port);
}

/// This rank's registration (rendezvous_messages.hpp).
inline std::string zmq_ring::registration(int world, const std::string& host, const std::string& want,
                                          const std::vector<std::string>& addrs) const {
  return format_registration(
      {rank_, world, host, net::machine_and_netns(), want, job_id_, std::to_string(::getpid()), net::launch_identity(), addrs});
}

inline void zmq_ring::rendezvous(const ring_options& o, const std::string& scheme, const std::string& want, const std::vector<std::string>& mine) {
  const auto deadline = clock::now() + setup_timeout_;
  const std::string host = net::hostname();
  const std::string where = "gradus: ring_allreduce: rendezvous at " + o.rendezvous + " (rank " + std::to_string(rank_) + " of " +
                            std::to_string(world_) + ", " + origin_of(o) + "): ";
  if (rank_ != 0) {
    // Rank 0 gives up on missing ranks after the timeout and says which; wait a little
    // longer than it, so that its verdict arrives.
    const auto answer_by = deadline + std::chrono::seconds(1);
    zmq::socket_t dealer(*ctx_, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::linger, 0);
    dealer.set(zmq::sockopt::ipv6, 1);
    const std::string dialled = rdv_dial_ + (rdv_note_.empty() ? "" : " (" + rdv_note_ + ")");
    try {
      dealer.connect(rdv_dial_);
    } catch (const zmq::error_t& e) {
      throw comm_error(where + "cannot connect to " + dialled + ": " + e.what());
    }
    const std::string reg = registration(world_, host, want, mine);
    dealer.send(zmq::buffer(reg), zmq::send_flags::none);
    zmq::message_t reply;
    while (true) {
      zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(net::ms_left(answer_by, 100)));
      if (dealer.recv(reply, zmq::recv_flags::dontwait)) break;
      if (clock::now() >= answer_by)
        throw comm_error(where + "no answer from rank 0 at " + dialled + " within " + std::to_string(setup_timeout_.count()) +
                         " ms (is rank 0 running, with the same rendezvous address and world_size, and reachable at that address?)");
    }
    std::string why;
    bool refused = false;
    auto a = parse_answer(reply.to_string_view(), world_, why, refused);
    if (!a) throw comm_error(refused && why != "rank 0 refused the registration" ? why : where + why);
    transport_ = std::move(a->transport);
    zmq_scheme_ = std::move(a->zmq_scheme);
    table_ = std::move(a->table);
    p2p_table_ = std::move(a->p2p_table);
    data_table_ = std::move(a->data_table);
    local_ranks_ = a->local_ranks[static_cast<std::size_t>(rank_)];
    return;
  }

  // ---- rank 0 ----
  zmq::socket_t router(*ctx_, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 2000);  // the answers must get out before close
  router.set(zmq::sockopt::ipv6, 1);
  const std::string what =
      "the rendezvous, " + origin_of(o) + (o.bind_host.empty() ? "" : ", on ring_options::bind_host = " + o.bind_host + " (GRADUS_BIND_ADDR)");
  if (scheme != "tcp") {
    bind_or_explain(router, o.rendezvous, what, o);
    // libzmq leaves an ipc path behind; the destructor (or a failed setup) removes it
    if (scheme == "ipc" && o.rendezvous.size() > 6 && o.rendezvous[6] != '@') ipc_files_.push_back(o.rendezvous.substr(6));
  } else {
    // Every address of listen_; one that this host lacks (::1 without IPv6) is skipped
    // while another one is bound.
    const std::string port = net::tcp_port_of(o.rendezvous);
    int bound = 0, first_err = 0;
    std::string first_failed;
    for (const auto& h : listen_) {
      const std::string ep = h == "*" ? "tcp://*:" + port : net::tcp_endpoint(h, port);
      try {
        router.bind(ep);
        ++bound;
      } catch (const zmq::error_t& e) {
        if (listen_.size() == 1 || (e.num() != EADDRNOTAVAIL && e.num() != EAFNOSUPPORT)) throw comm_error(listen_failure(ep, what, o, e.num()));
        if (first_failed.empty()) {
          first_failed = ep;
          first_err = e.num();
        }
      }
    }
    if (bound == 0) throw comm_error(listen_failure(first_failed, what, o, first_err));
  }
  struct entry {
    bool present = false;
    std::string host, machine;
    std::vector<std::string> addrs;
    std::string identity, pid, launch;
  };
  std::vector<entry> reg(static_cast<std::size_t>(world_));
  const std::string machine = net::machine_and_netns(), launch = net::launch_identity();
  reg[0] = {true, host, machine, mine, {}, std::to_string(::getpid()), launch};
  std::vector<std::string> identities;
  auto refuse = [&](const std::string& text) {
    for (const auto& id : identities) {
      router.send(zmq::buffer(id), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router.send(zmq::buffer(format_refusal(text)), zmq::send_flags::dontwait);
    }
    throw comm_error(text);
  };
  const auto process = [](const entry& e) {
    return "pid " + e.pid + " on host " + e.host + ", " + (e.launch.empty() ? std::string("launch unknown") : e.launch);
  };
  const std::string set_an_id =
      "two jobs on one rendezvous port? Give each job its own MASTER_PORT (gradus-run --port), or set GRADUS_JOB_ID to a "
      "value of its own on every rank of each job (gradus-run, torchrun and Slurm set one)";
  // Jobs started by hand name no job: a second claim of a rank (another job's rank sent to
  // this port) may come just after the first, so rank 0 listens a moment longer once every
  // rank has registered, and refuses both claims when it cannot tell which is its own.
  const bool by_hand = job_id_.empty() && scheme == "tcp";
  std::optional<clock::time_point> settled_at;
  int present = 1;
  while (true) {  // bounded: every round waits for the deadline or the end of the settle time
    if (present == world_) {
      if (!by_hand) break;
      if (!settled_at) settled_at = clock::now() + second_claim_wait;
      if (clock::now() >= *settled_at) break;
    }
    const auto until = settled_at ? std::min(deadline, *settled_at) : deadline;
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(net::ms_left(until, 100)));
    zmq::message_t id, body;
    if (!router.recv(id, zmq::recv_flags::dontwait)) {
      if (present < world_ && clock::now() >= deadline) {
        std::vector<int> missing;
        for (int r = 0; r < world_; ++r)
          if (!reg[r].present) missing.push_back(r);
        refuse(where + (missing.size() == 1 ? "rank " : "ranks ") + detail::join_ranks(missing) + " of world_size " +
               std::to_string(world_) + " did not register within " + std::to_string(setup_timeout_.count()) +
               " ms (not started, started with another rendezvous address, or gone to another job's rank 0 on this "
               "port? every job its own MASTER_PORT, or GRADUS_JOB_ID)");
      }
      continue;
    }
    if (!id.more() || !router.recv(body)) continue;
    std::string why;
    auto got = parse_registration(body.to_string_view(), why);
    // A rank of another job (two jobs sent to one port) is refused alone: this job goes on
    // waiting for its own ranks.
    const auto refuse_one = [&](const std::string& text) {
      router.send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
      router.send(zmq::buffer(format_refusal(text)), zmq::send_flags::dontwait);
    };
    if (got && got->job != job_id_ && (!got->job.empty() || !job_id_.empty())) {
      refuse_one(where + "rank " + std::to_string(got->rank) + " (host " + got->host + ") belongs to job '" + got->job +
                 "', rank 0 to job '" + job_id_ + "': two jobs on one rendezvous port? give each job its own MASTER_PORT "
                 "(gradus-run --port)");
      continue;
    }
    // A second claim of a rank that is here already: the claim of rank 0's own launch is
    // kept where exactly one of the two is; otherwise neither can be told to be this job's,
    // and both are refused, with the job.
    if (got && got->rank > 0 && got->rank < world_ && reg[static_cast<std::size_t>(got->rank)].present) {
      auto& e = reg[static_cast<std::size_t>(got->rank)];
      entry claim{true, got->host, got->machine, got->addrs, id.to_string(), got->pid, got->launch};
      const bool first_ours = e.launch == launch, second_ours = claim.launch == launch;
      const std::string r = "rank " + std::to_string(got->rank);
      if (first_ours != second_ours) {
        entry& loser = first_ours ? claim : e;
        const std::string text = where + r + " is claimed by two processes; the one of rank 0's launch (" +
                                 process(first_ours ? e : claim) + ") is kept, and this one (" + process(loser) +
                                 ") is refused: " + set_an_id;
        router.send(zmq::buffer(loser.identity), zmq::send_flags::sndmore | zmq::send_flags::dontwait);
        router.send(zmq::buffer(format_refusal(text)), zmq::send_flags::dontwait);
        if (!first_ours) {
          std::replace(identities.begin(), identities.end(), e.identity, claim.identity);
          e = std::move(claim);
        }
        continue;
      }
      identities.push_back(claim.identity);
      refuse(where + r + " registered twice, by " + process(e) + " and by " + process(claim) +
             ", and neither can be told to be this job's: both are refused and the job stops; " + set_an_id);
    }
    if (got && got->rank == 0) {  // (rank 0 listens; it never registers)
      refuse_one(where + "a process registered as rank 0 (pid " + got->pid + " on host " + got->host + "); this rank 0 (" +
                 process(reg[0]) + ") listens here: " + set_an_id);
      continue;
    }
    if (present == world_) {  // (a late registration of another kind: the job is complete)
      refuse_one(where + "the ring of " + std::to_string(world_) + " ranks is complete; this registration (" +
                 (got ? "rank " + std::to_string(got->rank) + ", host " + got->host : why) + ") is refused: " + set_an_id);
      continue;
    }
    identities.push_back(id.to_string());
    if (!got) refuse(where + why);
    const int r = got->rank, w = got->world;
    if (w != world_)
      refuse(where + "rank " + std::to_string(r) + " (host " + got->host + ") registered with world_size " + std::to_string(w) +
             ", but rank 0 has world_size " + std::to_string(world_));
    if (r < 0 || r >= world_)
      refuse(where + "a rank registered as rank " + std::to_string(r) + " (host " + got->host + "), outside world_size " +
             std::to_string(world_));
    // Every rank must ask for the same data path: rank 0's choice would otherwise overrule a
    // rank's silently, or find it without the address that path needs.
    if (got->want != want)
      refuse(where + "rank " + std::to_string(r) + " (host " + got->host + ") asked for transport " + got->want +
             ", but rank 0 for " + want +
             ": give every rank the same (ring_options::transport, --comm-transport, GRADUS_COMM_TRANSPORT)");
    reg[r] = {true, got->host, got->machine, std::move(got->addrs), identities.back(), got->pid, got->launch};
    ++present;
  }

  // The data path, and the kind of ZeroMQ socket for the control plane (and for the data,
  // on "zmq*"): shared memory and ipc when every rank shares this machine and network
  // namespace (abstract sockets are per namespace), else direct TCP and tcp.
  int stranger = -1;
  for (int r = 0; r < world_ && stranger < 0; ++r)
    if (scheme == "tcp" && (reg[r].host != host || reg[r].machine != machine)) stranger = r;
  const bool same = stranger < 0;
  std::string path = want, zs = scheme == "tcp" && same ? "ipc" : scheme;
  if (want == "auto") path = same ? "shm" : "tcp";
  if (want == "zmq-tcp" || want == "zmq-ipc") zs = want.substr(4);
  if (want == "shm" && !same)
    refuse(where + "transport shm needs every rank on one host, but rank " + std::to_string(stranger) + " is on host " + reg[stranger].host +
           " (machine " + reg[stranger].machine + ") and rank 0 on " + host + " (" + machine + "): use transport tcp or auto");
  const std::string chosen = path == "zmq" || path == "zmq-tcp" || path == "zmq-ipc" ? "zmq-" + zs : path;
  auto pick = [&](int r, const std::string& want_scheme) {
    auto it = std::find_if(reg[r].addrs.begin(), reg[r].addrs.end(), [&](const std::string& a) { return net::scheme_of(a) == want_scheme; });
    if (it == reg[r].addrs.end())
      refuse(where + "rank " + std::to_string(r) + " (host " + reg[r].host + ") has no " + want_scheme + " address (transport " + want + ")");
    return *it;
  };
  answer a{chosen, zs, {}, {}, {}, {}};
  for (int r = 0; r < world_; ++r) a.table.push_back(pick(r, zs));
  for (int r = 0; r < world_; ++r) a.p2p_table.push_back(pick(r, "p2p+" + zs).substr(4));
  if (has_data_path(chosen))
    for (int r = 0; r < world_; ++r) a.data_table.push_back(pick(r, chosen == "shm" ? "shm" : "tcpd"));
  // how many ranks share each rank's machine (a waiting rank spins only where each has a core)
  for (int r = 0; r < world_; ++r) {
    int c = 0;
    for (const auto& e : reg) c += e.host == reg[r].host && e.machine == reg[r].machine ? 1 : 0;
    a.local_ranks.push_back(c);
  }
  const std::string text = format_answer(a);
  for (int r = 1; r < world_; ++r) {
    router.send(zmq::buffer(reg[r].identity), zmq::send_flags::sndmore);
    router.send(zmq::buffer(text), zmq::send_flags::none);
  }
  transport_ = std::move(a.transport);
  zmq_scheme_ = std::move(a.zmq_scheme);
  table_ = std::move(a.table);
  p2p_table_ = std::move(a.p2p_table);
  data_table_ = std::move(a.data_table);
  local_ranks_ = a.local_ranks[0];
}

}  // namespace gradus::ring

#pragma once
// How a ring_allreduce communicator finds its peers.
#include <chrono>
#include <cstddef>
#include <string>

namespace zmq {
class context_t;
}

namespace gradus {

struct ring_options {
  int rank = 0;
  int world_size = 1;
  /// Where the ranks meet: rank 0 binds it, the others connect to it and register
  /// (rank, data address, hostname); rank 0 answers with the whole table.
  ///   "tcp://127.0.0.1:29500"      between processes or hosts (a host name, or an IPv6
  ///                                address in brackets: "tcp://[fd00::1]:29500")
  ///   "ipc:///tmp/gradus-job/rdv"  between processes on one host
  ///   "inproc://job"               ranks as threads sharing `context`
  /// A tcp host is resolved (getaddrinfo) before rank 0 binds it: a numeric address is bound
  /// as given; "localhost", or any name that resolves only to loopback addresses, binds
  /// each of them (127.0.0.1 and ::1 when both resolve, so that a rank reaches it whichever
  /// family its resolver prefers); this host's own name, and any other name, binds every
  /// interface (IPv6 and IPv4), because Debian maps the host's own name to 127.0.1.1 while
  /// other hosts reach it at its real address. The other ranks connect to the first
  /// address their own resolver returns.
  std::string rendezvous;
  /// Where `rendezvous` came from, for errors: e.g. "MASTER_ADDR=node1 and MASTER_PORT=29500
  /// (torchrun)" (cluster::spec::rendezvous_origin()); empty: the options themselves.
  std::string origin;
  /// The data path (examples: --comm-transport; GRADUS_COMM_TRANSPORT overrides "auto"):
  ///   "auto"     shm when every rank reports the same machine and network namespace, else
  ///              tcp; inproc for an inproc:// rendezvous
  ///   "shm"      shared memory between ranks of one host: a memfd segment per neighbour
  ///              pair, copied into once and reduced from in place (shm_path.hpp)
  ///   "tcp"      direct non-blocking TCP sockets between neighbours (tcp_path.hpp)
  ///   "zmq"      ZeroMQ sockets, ipc on one host, else tcp ("zmq-ipc", "zmq-tcp" force one;
  ///              "ipc" is the old name of "zmq-ipc"); "inproc" for ranks as threads
  /// Whatever the path, ZeroMQ carries the rendezvous, heartbeats and aborts. ipc sockets are
  /// Linux abstract sockets ("ipc://@gradus-ring-...": nothing on the filesystem, gone with
  /// the process) unless the rendezvous is an ipc:// path.
  std::string transport = "auto";
  /// The interface to listen on: rank 0's tcp rendezvous and every rank's tcp data socket
  /// (an ephemeral port). A numeric address, an interface name ("eth0"), a host name (its
  /// addresses), or "*" (every interface). Default (empty): rank 0's data socket binds as
  /// its rendezvous does; another rank binds the loopback address of the family it reaches
  /// rank 0 by when that address is a loopback one, else every interface, advertising the
  /// local address that routes to rank 0 (or, without a route, this host's name).
  /// cluster::from_env() reads it from GRADUS_BIND_ADDR.
  std::string bind_host;
  /// The job these ranks belong to (cluster::spec::job_id: GRADUS_JOB_ID, torchrun's run id,
  /// Slurm's job and step). Rank 0 refuses a rank of another job alone (two jobs sent to one
  /// port) and goes on waiting for its own; empty: no job named.
  std::string job_id;
  /// The longest any one wait may last (rendezvous, a message from a peer, a send to
  /// complete). A peer whose connection closes (a killed process) is noticed within about
  /// half a second instead. A peer that answers nothing at all (stopped, hung, unreachable)
  /// is dropped by ZeroMQ heartbeats after timeout - 2 s (at least 3 s), so that its own
  /// neighbours blame it before every other rank's wait times out: a rank may be paused
  /// (SIGSTOP, a debugger) for up to that long and the job goes on.
  std::chrono::milliseconds timeout{30000};
  /// Messages carry at most this many bytes: a collective streams segment by segment, so
  /// sending, receiving and reducing overlap.
  std::size_t segment_bytes = std::size_t{1} << 20;
  /// Latency-bound all-reduces: when (world_size - 1) x the buffer's bytes on the wire is at
  /// most this (and the buffer fits one segment), the ranks pass whole buffers around the
  /// ring (an all-gather: N - 1 hops instead of the ring's 2(N - 1)) and each adds the N of
  /// them in rank order, so every rank still ends with the same bits. NCCL and Gloo switch
  /// algorithms by size the same way. 0: always the bandwidth-optimal ring. Must be the
  /// same on every rank (a rank that disagrees is named, as a mismatched collective is).
  std::size_t small_bytes = std::size_t{32} << 10;
  /// The ZeroMQ context to use (required for inproc://); null: the communicator owns one.
  zmq::context_t* context = nullptr;
  /// Gradient compression of allreduce_sum / allreduce_average: "none", or "fp16" (Horovod's
  /// Compression.fp16): every segment travels as IEEE half precision and is summed in the
  /// element type, trading precision (11 significant bits per hop; |values| above 65504
  /// become infinity) for half the bytes. Every rank still ends with the same bits (the
  /// owner of a chunk rounds its own copy as the others receive it). Broadcasts are never
  /// compressed. Examples: --comm-compress fp16.
  std::string compress = "none";
  /// Background I/O threads of an owned context.
  int io_threads = 1;
};

}  // namespace gradus

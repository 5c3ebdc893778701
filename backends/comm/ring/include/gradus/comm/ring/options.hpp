#pragma once
// How a ring_allreduce communicator finds its peers.
#include <chrono>
#include <cstddef>
#include <string>

namespace zmq {
class context_t;
}

namespace gradus {

/// The shortest rendezvous the ring waits for by default (ring_options::rendezvous_timeout).
inline constexpr std::chrono::milliseconds min_rendezvous_timeout{5000};
/// How long rank 0 goes on listening after every rank registered, in a job that names no job
/// id (ranks started by hand on a tcp rendezvous), for a second claim of a rank: another
/// job's ranks sent to the same MASTER_PORT register within moments of this job's.
inline constexpr std::chrono::milliseconds second_claim_wait{500};

/// What a ring_allreduce is told: its rank and world, where the ranks meet, the data path,
/// the deadlines and sizes. The constructor from a cluster spec fills rank, world_size,
/// rendezvous and origin, and job_id and bind_host where they are empty. Every rank must be
/// given the same world_size, transport, segment_bytes, small_bytes and compress.
/// A world of one makes no connection: only its rank, world_size and compress are checked.
struct ring_options {
  /// This process's rank, 0 ... world_size - 1 (default 0); rank 0 holds the rendezvous.
  /// Outside that range the constructor throws gradus::error; a second process registering
  /// a rank that is there already is refused alone (its constructor throws
  /// gradus::comm_error) while rank 0 goes on waiting.
  int rank = 0;
  /// How many ranks the ring has (default 1: a world of one, whose collectives return at
  /// once). Below 1 the constructor throws gradus::error. A rank registering with another
  /// world_size than rank 0's fails the rendezvous: every rank that registered, and rank 0,
  /// throw gradus::comm_error naming it.
  int world_size = 1;
  /// Where the ranks meet: rank 0 binds it, the others connect to it and register
  /// (rank, data address, hostname); rank 0 answers with the whole table.
  /// - "tcp://127.0.0.1:29500": between processes or hosts (a host name, or an IPv6
  ///   address in brackets: "tcp://[fd00::1]:29500")
  /// - "ipc:///tmp/gradus-job/rdv": between processes on one host
  /// - "inproc://job": ranks as threads sharing `context`
  ///
  /// A tcp host is resolved (getaddrinfo) before rank 0 binds it: a numeric address is bound
  /// as given; "localhost", or any name that resolves only to loopback addresses, binds
  /// each of them (127.0.0.1 and ::1 when both resolve, so that a rank reaches it whichever
  /// family its resolver prefers); this host's own name, and any other name, binds every
  /// interface (IPv6 and IPv4), because Debian maps the host's own name to 127.0.1.1 while
  /// other hosts reach it at its real address. The other ranks connect to the first
  /// address their own resolver returns. Another scheme (or none) throws gradus::error; a
  /// name that does not resolve throws gradus::comm_error. Rank 0 waits up to `timeout` for
  /// every rank to register, then names the missing ones.
  std::string rendezvous;
  /// Where `rendezvous` came from, for errors: e.g. "MASTER_ADDR=node1 and MASTER_PORT=29500
  /// (torchrun)" (cluster::spec::rendezvous_origin()); empty: the options themselves.
  std::string origin;
  /// The data path (examples: `--comm-transport`; GRADUS_COMM_TRANSPORT overrides "auto"):
  /// - "auto": shm when every rank reports the same machine and network namespace, else
  ///   tcp; inproc for an inproc:// rendezvous
  /// - "shm": shared memory between ranks of one host: a memfd segment per neighbour
  ///   pair, copied into once and reduced from in place (shm_path.hpp)
  /// - "tcp": direct non-blocking TCP sockets between neighbours (tcp_path.hpp)
  /// - "zmq": ZeroMQ sockets, ipc on one host, else tcp ("zmq-ipc", "zmq-tcp" force one;
  ///   "ipc" is the old name of "zmq-ipc"); "inproc" for ranks as threads
  ///
  /// Whatever the path, ZeroMQ carries the rendezvous, heartbeats and aborts. ipc sockets are
  /// Linux abstract sockets (`"ipc://@gradus-ring-..."`: nothing on the filesystem, gone with
  /// the process) unless the rendezvous is an ipc:// path. Any other value, or inproc with a
  /// rendezvous that is not inproc:// (and the reverse), throws gradus::error. Every rank must
  /// ask for the same path, and "shm" needs every rank on one machine: otherwise the
  /// rendezvous fails (gradus::comm_error on every rank, naming the one that differs).
  /// Default "auto".
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
  /// (SIGSTOP, a debugger) for up to that long and the job goes on. Default 30 s (the
  /// examples' `--comm-timeout`). A wait that runs out throws gradus::comm_error naming the
  /// peer, and the communicator is unusable afterwards. Zero or negative: the constructor
  /// throws gradus::error. Keep it well above a collective's time.
  std::chrono::milliseconds timeout{30000};
  /// How long the ring may take to form: names resolved, every rank registered at rank 0,
  /// the data paths connected. Processes started together reach the rendezvous seconds apart
  /// (start-up, data loading), however short the collectives' waits are, so the default (0)
  /// is `timeout`, but at least min_rendezvous_timeout (5 s). torchrun's rendezvous likewise
  /// has a join timeout of its own. Negative: the constructor throws gradus::error.
  std::chrono::milliseconds rendezvous_timeout{0};
  /// Messages carry at most this many bytes: a collective streams segment by segment, so
  /// sending, receiving and reducing overlap. Default 1 MiB; the shared-memory path moves at
  /// most 256 KiB a slot. Below 64 the constructor throws gradus::error. Must be the same on
  /// every rank (a rank that disagrees fails its collectives, naming the segment).
  std::size_t segment_bytes = std::size_t{1} << 20;
  /// Latency-bound all-reduces: when (world_size - 1) x the buffer's bytes on the wire is at
  /// most this (and the buffer fits one segment), the ranks pass whole buffers around the
  /// ring (an all-gather: N - 1 hops instead of the ring's 2(N - 1)) and each adds the N of
  /// them in rank order, so every rank still ends with the same bits. NCCL and Gloo switch
  /// algorithms by size the same way. 0: always the bandwidth-optimal ring. Must be the
  /// same on every rank (a rank that disagrees is named, as a mismatched collective is).
  /// Default 32 KiB.
  std::size_t small_bytes = std::size_t{32} << 10;
  /// The ZeroMQ context to use (required for inproc://: every thread-rank passes the same;
  /// without one an inproc:// rendezvous throws gradus::error); it must outlive the
  /// communicator. Null (default): the communicator owns one, with io_threads I/O threads.
  zmq::context_t* context = nullptr;
  /// Gradient compression of allreduce_sum / allreduce_average: "none", "fp16" (Horovod's
  /// Compression.fp16) or "bf16": every segment travels as IEEE half precision (11 significant
  /// bits; |values| above 65504 become infinity) or as bfloat16 (8 significant bits, float's
  /// range) and is summed in the element type, for half the bytes. An fp16 average divides by
  /// world_size before the sum (Horovod's gradient_predivide_factor). Every rank still ends
  /// with the same bits (the owner of a chunk rounds its own copy as the others receive it).
  /// Broadcasts are never compressed; allreduce_average(x, wire) chooses per call (the
  /// session's precision policy, through the data-parallel step). Examples: `--comm-compress`.
  /// Any other value throws gradus::error from the constructor. Default "none".
  std::string compress = "none";
  /// Background I/O threads of an owned context (default 1; values below 1 count as 1).
  /// Unused when `context` is given.
  int io_threads = 1;
};

}  // namespace gradus

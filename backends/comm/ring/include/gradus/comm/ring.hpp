#pragma once
// gradus::ring_allreduce — the communicator policy of synchronous data parallelism: ranks
// on a ring (each sends to rank+1 and receives from rank-1), meeting through rank 0
// (ring_options::rendezvous). The data moves over shared memory between ranks of one host,
// direct TCP sockets between hosts, or ZeroMQ (ring_options::transport); ZeroMQ always
// carries the rendezvous, heartbeats and aborts.
//
//   gradus::ring_allreduce comm({.rank = r, .world_size = n, .rendezvous = "tcp://10.0.0.1:29500"});
//   comm.broadcast(std::span(weights), 0);
//   comm.allreduce_average(std::span(gradients));
//
// Every collective has a timeout (ring_options::timeout), a peer whose connection drops
// makes every rank throw gradus::comm_error within a few seconds, and the ranks check
// that they run the same collective (sequence number, op, dtype, element count) from the
// header of the first message each receives. After a comm_error the communicator is
// unusable: destroy it (before freeing the buffers of the failed collective, which ZeroMQ
// may still be sending from).
//
// Point-to-point (parallel::point_to_point): send(x, to) and recv(x, from) between any two
// ranks, both directions, over a mesh of ZeroMQ connections beside the ring, made on first
// use (ring/point_to_point.hpp); a dead peer fails them as fast as it fails a collective.
// Sub-groups (parallel::splittable): split(color, key) returns a ring::sub_group whose
// collectives and point-to-point run over that mesh (ring/sub_group.hpp).
//
// One thread at a time: a communicator may move between threads (a trainer's background
// all-reduce thread), but two collectives, or a collective and a send or recv, or calls on
// it and on one of its sub-groups, must never run at once.
//
// About 610 lines with its doc comments, one concept: the communicator's face (collectives, point-to-point,
// split) and the ring's algorithms, which share its state; the transports, the mesh and the
// sub-groups are headers of their own (ring/).
#include <algorithm>
#include <concepts>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gradus/comm/ring/options.hpp"
#include "gradus/comm/ring/pair.hpp"
#include "gradus/comm/ring/point_to_point.hpp"
#include "gradus/comm/ring/zmq_ring.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/communicator.hpp"
#include "gradus/parallel/elements.hpp"
#include "gradus/parallel/half_wire.hpp"
#include "gradus/parallel/point_to_point.hpp"

namespace gradus {

namespace ring {
class sub_group;
}

namespace ring::detail {

/// dst += src, a loop the compiler vectorises (no aliasing: src is a received message).
template <class T>
void add_into(T* __restrict dst, const T* __restrict src, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] += src[i];
}
template <class T>
void scale(T* __restrict dst, T factor, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] *= factor;
}

}  // namespace ring::detail

/// The communicator policy of synchronous data parallelism (target gradus::ring;
/// `<gradus/comm/ring.hpp>`): ranks on a ring that meet through rank 0
/// (ring_options::rendezvous) and move data over shared memory, direct TCP or ZeroMQ
/// (ring_options::transport). Collectives (parallel::communicator) on float and double spans
/// (broadcast also of bytes), any length including 0, in place; every rank ends with the
/// same bits. Point-to-point send / recv between any two ranks (parallel::point_to_point)
/// and sub-groups by split (parallel::splittable) run over a mesh beside the ring.
///
/// Every wait has a deadline (ring_options::timeout); a dead or silent peer, or ranks that
/// run different collectives, make every rank throw gradus::comm_error naming the peer
/// within seconds. After a comm_error the communicator is unusable: destroy it before
/// freeing the failed collective's buffers. One call at a time (it may move between
/// threads); its sub-groups share that rule.
///
/// ```
/// gradus::ring_allreduce comm({.rank = r, .world_size = n, .rendezvous = "tcp://10.0.0.1:29500"});
/// comm.broadcast(std::span(weights), 0);
/// comm.allreduce_average(std::span(gradients));
/// ```
class ring_allreduce {
 public:
  /// The communicator's name in messages and in the type-erased holders (`--comm ring`).
  static constexpr const char* name = "ring";

  /// Rendezvous through rank 0, connect to the ring neighbours and check the ring end to
  /// end (a barrier), all within options.timeout. Throws gradus::error for options that are
  /// wrong (ring_options says which), and gradus::comm_error when the ring cannot form (a
  /// rank missing at the timeout, a refused registration, an address that cannot be bound
  /// or reached).
  explicit ring_allreduce(const ring_options& options)
      : opt_(checked(options)),
        link_(std::make_unique<ring::zmq_ring>(options)),
        mesh_(link_->world_size() > 1 ? std::make_unique<ring::mesh>(*link_) : std::make_unique<ring::mesh>(link_->rank())) {
    if (world_size() > 1) {
      ring::fingerprint fp{0, 0, ring::op_code::connect, element_type::none, 0};
      run(fp, [&] { token_ring(fp); });
    }
  }
  /// From a cluster spec (gradus::cluster::from_env(): TF_CONFIG, torchrun, Slurm, OpenMPI,
  /// GRADUS_CLUSTER): its rank, world size and rendezvous; the rest from `base`.
  /// `g::trainer<g::cpu_simd, g::ring_allreduce> t(g::cluster::from_env());` (gradus/parallel/trainer.hpp)
  template <class Spec>
    requires requires(const Spec& c) {
      { c.rank } -> std::convertible_to<int>;
      { c.world_size } -> std::convertible_to<int>;
      { c.rendezvous() } -> std::convertible_to<std::string>;
    }
  explicit ring_allreduce(const Spec& cluster, ring_options base = {})
      : ring_allreduce(with_cluster(cluster, std::move(base))) {}
  ring_allreduce(const ring_allreduce&) = delete;
  ring_allreduce& operator=(const ring_allreduce&) = delete;
  ~ring_allreduce() = default;

  /// This process's rank, 0 ... world_size() - 1.
  int rank() const { return link_->rank(); }
  /// How many ranks the ring has.
  int world_size() const { return link_->world_size(); }
  /// The data path in use: "shm" (shared memory), "tcp" (direct sockets), "zmq-ipc" or
  /// "zmq-tcp" (ZeroMQ), "inproc" (threads), or "none" for a world of one.
  const std::string& transport() const { return link_->transport(); }
  /// Every rank's data address, by rank (empty for a world of one).
  const std::vector<std::string>& addresses() const { return link_->addresses(); }

  /// x <- the elementwise sum of every rank's x. Every rank ends with the same bits.
  template <parallel::collective_element T>
  void allreduce_sum(std::span<T> x) {
    allreduce(x, ring::op_code::allreduce_sum);
  }
  /// x <- the sum times 1/world_size (computed once, by the owner of each chunk).
  template <parallel::collective_element T>
  void allreduce_average(std::span<T> x) {
    allreduce(x, ring::op_code::allreduce_average);
  }
  /// The average with x travelling as `wire` (parallel::wire_collectives): bf16 or f16, each
  /// hop's partial sum widened and summed in x's type; f16 divides by world_size before the
  /// sum (Horovod's gradient_predivide_factor), so a sum of world_size gradients near fp16's
  /// largest value does not overflow. f32 / none: as ring_options::compress says. Every rank
  /// must pass the same wire (a rank that differs is named, as a mismatched collective is).
  template <parallel::collective_element T>
  void allreduce_average(std::span<T> x, element_type wire) {
    if (wire != element_type::none && wire != element_type::f32 && !parallel::half_wire::is_half(wire))
      throw error("gradus: ring_allreduce: allreduce_average: gradients cannot travel as " +
                  std::string(name_of(wire)) + " (float32, bfloat16 or float16)");
    allreduce(x, ring::op_code::allreduce_average, parallel::half_wire::is_half(wire) ? wire : element_type::none);
  }

  /// x <- root's x, streamed segment by segment along the ring from root.
  template <parallel::broadcast_element T>
  void broadcast(std::span<T> x, int root) {
    if (root < 0 || root >= world_size())
      throw error("gradus: ring_allreduce: broadcast from rank " + std::to_string(root) + " of a world of " + std::to_string(world_size()));
    const auto fp = next(ring::op_code::broadcast, parallel::element_of<T>, x.size(), root);
    if (world_size() == 1) return;
    run(fp, [&] { broadcast_ring(x, root, fp); });
  }

  /// Returns once every rank has entered the barrier.
  void barrier() {
    const auto fp = next(ring::op_code::barrier, element_type::none, 0, 0);
    if (world_size() == 1) return;
    run(fp, [&] { token_ring(fp); });
  }

  // ---- point-to-point (parallel::point_to_point) ----
  /// x to rank `to` (any rank, this one included); returns once x may be reused: between
  /// processes of one host once it is copied into the pair's shared-memory segment, over
  /// ZeroMQ at once (copied) below 8 MiB (ring::mesh::copy_below) and once in the kernel
  /// from there. A rank outside the world throws gradus::error. Messages
  /// from one rank to another arrive in the order they were sent; they do not interleave
  /// with collectives, which may run between a send and its recv.
  template <parallel::broadcast_element T>
  void send(std::span<const T> x, int to) {
    check_peer(to, "send to");
    const std::string doing = "send of " + ring::elements(x.size(), parallel::element_of<T>) + " to rank " + std::to_string(to);
    ring::p2p_header h;
    h.dtype = parallel::element_of<T>;
    h.count = x.size();
    run_as([&] { return doing; }, [&] { mesh_->send(to, h, std::as_bytes(x), deadline(), doing); });
  }
  /// How this rank's messages to `to` travel: "shared memory" (a segment of its own, ranks on
  /// one host: ring/p2p_shm.hpp), "zeromq", or "" before the first one.
  std::string point_to_point_path(int to) const { return std::string(mesh_->path_to(to)); }
  /// x <- the next message from rank `from`, which must hold x.size() elements of T: another
  /// size or dtype throws gradus::error naming the peer and both sizes, and the message stays
  /// queued (the communicator stays usable). Messages from other ranks queue meanwhile. A dead
  /// or silent peer throws gradus::comm_error naming it (comm_error::peer) within about half a
  /// second of its death, or at the timeout; the communicator is unusable afterwards.
  template <parallel::broadcast_element T>
  void recv(std::span<T> x, int from) {
    check_peer(from, "recv from");
    const std::string doing = "recv of " + ring::elements(x.size(), parallel::element_of<T>) + " from rank " + std::to_string(from);
    run_as([&] { return doing; }, [&] {
      const auto& m = mesh_->next(from, 0, deadline(), doing);
      ring::take_payload(m, parallel::element_of<T>, x.size(), std::as_writable_bytes(x), mesh_->prefix(doing), "rank " + std::to_string(from));
      mesh_->pop(from, 0);
    });
  }

  /// Whether the next message from rank `from` has arrived, so that recv(x, from) would not
  /// wait (MPI_Iprobe): for a caller with other work to do meanwhile (a pipeline stage's
  /// weight gradients while it waits for a gradient). Waits for nothing; a failed
  /// communicator throws as recv does.
  bool probe(int from) {
    check_peer(from, "probe");
    bool here = false;
    run_as([&] { return "probe for a message from rank " + std::to_string(from); }, [&] { here = mesh_->arrived(from, 0); });
    return here;
  }

  // ---- sub-groups (parallel::splittable) ----
  /// MPI_Comm_split: every rank calls it (a collective on this communicator); the ranks that
  /// pass the same color (>= 0) form a group, ranked by key, ties by their rank here. The
  /// group's collectives and point-to-point run over this communicator's mesh. A sub-group
  /// must not outlive this communicator (using it afterwards throws gradus::error). A
  /// negative color on any rank makes every rank throw gradus::error naming that rank.
  /// Defined in ring/sub_group.hpp.
  ring::sub_group split(int color, int key);

 private:
  friend class ring::sub_group;

  void check_peer(int peer, const char* doing) const {
    if (peer < 0 || peer >= world_size())
      throw error("gradus: ring_allreduce: " + std::string(doing) + " rank " + std::to_string(peer) + " of a world of " +
                  std::to_string(world_size()) + " (rank " + std::to_string(rank()) + ")");
  }

  static const ring_options& checked(const ring_options& o) {
    if (o.compress != "none" && o.compress != "fp16" && o.compress != "bf16")
      throw error("gradus: ring_allreduce: compress '" + o.compress + "' must be none, fp16 or bf16");
    if (o.timeout.count() <= 0)  // every wait would fail at once
      throw error("gradus: ring_allreduce: timeout must be positive, got " + std::to_string(o.timeout.count()) +
                  " ms (ring_options::timeout; the examples' --comm-timeout)");
    if (o.rendezvous_timeout.count() < 0)
      throw error("gradus: ring_allreduce: rendezvous_timeout must not be negative, got " +
                  std::to_string(o.rendezvous_timeout.count()) + " ms (0: the timeout, at least 5 s)");
    return o;
  }
  template <class Spec>
  static ring_options with_cluster(const Spec& c, ring_options o) {
    if (c.rank < 0)
      throw error("gradus: ring_allreduce: this process is not a worker of its cluster spec (rank " +
                  std::to_string(c.rank) + ")");
    o.rank = c.rank;
    o.world_size = c.world_size;
    o.rendezvous = c.rendezvous();
    // where the address came from (MASTER_ADDR, a Slurm node list, TF_CONFIG...), for errors
    if constexpr (requires { c.rendezvous_origin(); }) o.origin = c.rendezvous_origin();
    if constexpr (requires { c.job_id; }) {
      if (o.job_id.empty()) o.job_id = c.job_id;  // GRADUS_JOB_ID, torchrun's run id, Slurm's job
    }
    if constexpr (requires { c.bind_addr; }) {
      if (o.bind_host.empty()) o.bind_host = c.bind_addr;  // GRADUS_BIND_ADDR
    }
    return o;
  }
  ring::fingerprint next(ring::op_code op, element_type dt, std::size_t count, int root) {
    return ring::fingerprint{++seq_, static_cast<std::uint64_t>(count), op, dt, root};
  }
  ring::clock::time_point deadline() const { return ring::clock::now() + opt_.timeout; }
  /// The header of this rank's messages in collective fp (step, segment, bytes: per message).
  ring::frame_header header(const ring::fingerprint& fp) const {
    ring::frame_header h;
    h.from = rank();
    h.fp = fp;
    return h;
  }

  /// Runs one collective; any failure is remembered, passed along the ring, and rethrown.
  template <class F>
  void run(const ring::fingerprint& fp, F&& body) {
    run_as([&] { return ring::to_string(fp); }, std::forward<F>(body));
  }
  /// The same for any operation (a send, a recv, a sub-group's collective), named by doing().
  /// A comm_error (or ZeroMQ's) breaks the communicator: the ring's neighbours and the mesh's
  /// connected peers are told. A gradus::error (a usage error: a recv of the wrong size)
  /// passes through and breaks nothing.
  template <class Doing, class F>
  void run_as(Doing&& doing, F&& body) {
    if (!broken_.empty())
      throw comm_error("gradus: ring_allreduce: " + doing() + " on rank " + std::to_string(rank()) +
                       ": the communicator failed earlier and cannot be used; destroy it. The first error: " + broken_);
    try {
      body();
    } catch (const comm_error& e) {
      broken_ = e.what();
      mesh_->fail(broken_);
      link_->fail(broken_);
      throw;
    } catch (const zmq::error_t& e) {
      broken_ = "gradus: ring_allreduce: " + doing() + " on rank " + std::to_string(rank()) + ": ZeroMQ: " + e.what();
      if (e.num() == ETERM) {
        mesh_->close_now();
        link_->close_now();
      } else {
        mesh_->fail(broken_);
        link_->fail(broken_);
      }
      throw comm_error(broken_);
    }
  }

  /// Every received header must match this rank's own collective, step and segment.
  void expect(const ring::message& m, const ring::fingerprint& fp, std::uint32_t step, std::uint64_t segment, std::size_t bytes) {
    auto& L = link_->left();
    const std::string doing = ring::to_string(fp);
    if (!(m.header.fp == fp) && m.header.fp.algo != fp.algo) {
      auto same = m.header.fp;
      same.algo = fp.algo;
      if (same == fp)
        throw comm_error("gradus: ring_allreduce: " + doing + " on rank " + std::to_string(rank()) + ": rank " + std::to_string(L.peer()) +
                         " (" + L.address() + ") runs it as " + ring::algo_name(m.header.fp.algo) + " but rank " + std::to_string(rank()) +
                         " as " + ring::algo_name(fp.algo) + ": ring_options::small_bytes (or segment_bytes) differs between ranks");
    }
    if (!(m.header.fp == fp))
      throw comm_error("gradus: ring_allreduce: " + doing + " on rank " + std::to_string(rank()) + ": rank " + std::to_string(L.peer()) +
                       " (" + L.address() + ") is running " + ring::to_string(m.header.fp) + " but rank " + std::to_string(rank()) +
                       " is running " + doing + ": every rank must call the same collectives in the same order with the same sizes");
    if (m.header.step != step || m.header.segment != segment || m.header.bytes != bytes)
      throw comm_error("gradus: ring_allreduce: " + doing + " on rank " + std::to_string(rank()) + ": rank " + std::to_string(L.peer()) +
                       " (" + L.address() + ") sent step " + std::to_string(m.header.step) + " segment " + std::to_string(m.header.segment) +
                       " of " + std::to_string(m.header.bytes) + " bytes; expected step " + std::to_string(step) + " segment " +
                       std::to_string(segment) + " of " + std::to_string(bytes) + " bytes (segment_bytes differs between ranks?)");
  }

  /// Ring all-reduce, as reduce-scatter then all-gather over N chunks (chunk c: elements
  /// [c*n/N, (c+1)*n/N), the first n%N chunks one longer; empty when n < N).
  ///
  ///   step s = 0 .. 2(N-1)-1: rank r sends chunk (r-s) mod N to r+1 and receives chunk
  ///   (r-s-1) mod N from r-1. In the first N-1 steps (reduce-scatter) it adds what it
  ///   receives to its own copy; after them rank r holds the complete sum of chunk
  ///   (r+1) mod N. In the last N-1 steps (all-gather) it overwrites with what it receives.
  ///
  /// So chunk c is summed in one fixed order, x_c + x_{c+1} + ... + x_{c+N-1} (ranks mod N,
  /// left to right), by its owner (c-1) mod N, who also applies the 1/N of an average; the
  /// all-gather copies the owner's bits to everyone. Same world size, same inputs: the
  /// same bits on every rank and in every run, whatever the timing.
  ///
  /// Each chunk travels as segments of segment_bytes. Steps are pipelined per segment: as
  /// soon as segment k of step s is reduced it is posted (zero-copy) as segment k of step
  /// s+1, while later segments are still arriving, so sending, receiving and reducing
  /// overlap and up to a whole chunk is in flight.
  /// wire: what x travels as (f16, bf16); none: ring_options::compress's.
  template <parallel::collective_element T>
  void allreduce(std::span<T> x, ring::op_code op, element_type wire = element_type::none) {
    auto fp = next(op, parallel::element_of<T>, x.size(), 0);
    if (wire == element_type::none && op != ring::op_code::split)  // split's table stays exact
      wire = opt_.compress == "fp16" ? element_type::f16 : opt_.compress == "bf16" ? element_type::bf16 : element_type::none;
    fp.wire = wire;
    if (world_size() == 1) return;  // the sum of one; x * (1/1) == x
    const std::size_t bytes = x.size() * (parallel::half_wire::is_half(fp.wire) ? 2 : sizeof(T));
    if (bytes * static_cast<std::size_t>(world_size() - 1) <= opt_.small_bytes && bytes <= link_->segment_bytes(opt_.segment_bytes))
      fp.algo = ring::algo_code::gather;
    run(fp, [&] {
      if (fp.algo == ring::algo_code::gather) allreduce_gather(x, fp);
      else allreduce_ring(x, fp);
    });
  }

  /// Small buffers, where a ring's 2(N-1) dependent hops cost more than its bytes: every
  /// rank's whole buffer goes around the ring (step s: rank r passes rank (r-s)'s buffer to
  /// r+1 and receives rank (r-s-1)'s from r-1), N-1 hops, and each rank adds the N buffers
  /// in rank order 0, 1, ..., N-1 (times 1/N for an average): the same bits everywhere.
  /// A two-byte wire: each rank's buffer travels compressed, its own copy rounded as the
  /// others see it; an f16 average divides by N first (predivides()).
  template <parallel::collective_element T>
  void allreduce_gather(std::span<T> x, const ring::fingerprint& fp) {
    const int N = world_size(), r = rank();
    const std::size_t n = x.size();
    const bool half = parallel::half_wire::is_half(fp.wire);
    const bool pre = predivides(fp);
    if (pre) ring::detail::scale(x.data(), T(1) / static_cast<T>(N), n);
    const std::size_t block = n * (half ? 2 : sizeof(T));
    // rank q's buffer (as it travels) at gathered_[q * block]. On 2 ranks x_r + x_other is
    // x_other + x_r bit for bit, so x is sent as it is and added to in place; otherwise x's
    // own block is kept there too, since the sum in rank order overwrites x. The previous
    // collective's sends from here are complete.
    const bool in_place = N == 2;
    gathered_.resize(static_cast<std::size_t>(N) * block);
    auto at = [&](int q) { return gathered_.data() + static_cast<std::size_t>(q) * block; };
    if (half) parallel::half_wire::compress(fp.wire, x.data(), at(r), n);
    else if (!in_place && block) std::memcpy(at(r), x.data(), block);
    auto& L = link_->left();
    auto& R = link_->right();
    const std::string doing = ring::to_string(fp);
    ring::frame_header h = header(fp);
    h.bytes = block;
    std::uint64_t last = R.send(h, half || !in_place ? std::span<const std::byte>(at(r), block) : std::as_bytes(x));
    if (in_place) {
      if (half) parallel::half_wire::round_trip(fp.wire, x.data(), n);  // x is not what travels
      ring::message m = L.recv(deadline(), doing);
      expect(m, fp, 0, 0, block);
      R.wait_sent(last, deadline(), doing);  // x is no longer read by the send
      if (half) parallel::half_wire::decompress<true>(fp.wire, x.data(), m.payload.data(), n);
      else add_received(x, m.payload);
    } else {
      auto mod = [N](int a) { return ((a % N) + N) % N; };
      for (int s = 0; s < N - 1; ++s) {
        const int q = mod(r - s - 1);
        ring::message m = L.recv(deadline(), doing);
        expect(m, fp, static_cast<std::uint32_t>(s), 0, block);
        if (block) std::memcpy(at(q), m.payload.data(), block);
        m = {};  // frees the sender's slot before the next hop
        if (s + 1 < N - 1) {
          h.step = static_cast<std::uint32_t>(s + 1);
          last = R.send(h, std::span<const std::byte>(at(q), block));
        }
      }
      R.wait_sent(last, deadline(), doing);
      for (int q = 0; q < N; ++q) {
        if (half) {
          if (q == 0) parallel::half_wire::decompress<false>(fp.wire, x.data(), at(q), n);
          else parallel::half_wire::decompress<true>(fp.wire, x.data(), at(q), n);
        } else {
          const T* from = reinterpret_cast<const T*>(at(q));
          if (q == 0) std::copy(from, from + n, x.data());
          else ring::detail::add_into(x.data(), from, n);
        }
      }
    }
    if (fp.op == ring::op_code::allreduce_average && !pre) ring::detail::scale(x.data(), T(1) / static_cast<T>(N), n);
  }

  /// An average over an f16 wire divides each rank's x by N before the sum: partial sums of N
  /// values near fp16's largest (65504) would otherwise overflow on the wire.
  static bool predivides(const ring::fingerprint& fp) {
    return fp.op == ring::op_code::allreduce_average && fp.wire == element_type::f16;
  }

  template <parallel::collective_element T>
  void allreduce_ring(std::span<T> x, const ring::fingerprint& fp) {
    const int N = world_size(), r = rank();
    const std::size_t n = x.size(), base = n / N, rem = n % N;
    // Segments of segment_bytes: a larger chunk streams as several. Splitting smaller chunks
    // further (at least 4 segments, down to 64 or 256 KiB) measured slower on 2 cores: each
    // message costs a few thread wake-ups in ZeroMQ (benchmarks/results/allreduce_vs_mpi-9fc7f8c.md).
    // A two-byte wire: each segment is compressed into wire_ (at the same offsets as in x)
    // and sent from there; what arrives is widened as it is added or copied.
    const bool half = parallel::half_wire::is_half(fp.wire);
    const std::size_t wire_size = half ? 2 : sizeof(T);
    if (half) wire_.resize(2 * n);
    const std::size_t seg = std::max<std::size_t>(1, link_->segment_bytes(opt_.segment_bytes) / wire_size);
    auto mod = [N](int a) { return ((a % N) + N) % N; };
    auto chunk_begin = [&](int c) { return static_cast<std::size_t>(c) * base + std::min<std::size_t>(c, rem); };
    auto chunk_size = [&](int c) { return base + (static_cast<std::size_t>(c) < rem ? 1 : 0); };
    auto segments = [&](int c) { return std::max<std::size_t>(1, (chunk_size(c) + seg - 1) / seg); };
    auto piece = [&](int c, std::size_t k) {
      const std::size_t size = chunk_size(c), lo = std::min(size, k * seg);
      return x.subspan(chunk_begin(c) + lo, std::min(seg, size - lo));
    };
    // The ticket of the latest send of each (chunk, segment), to wait on before overwriting.
    std::vector<std::size_t> first(static_cast<std::size_t>(N) + 1, 0);
    for (int c = 0; c < N; ++c) first[c + 1] = first[c] + segments(c);
    constexpr auto none = std::numeric_limits<std::uint64_t>::max();
    std::vector<std::uint64_t> ticket(first[N], none);

    auto& L = link_->left();
    auto& R = link_->right();
    const std::string doing = ring::to_string(fp);
    ring::frame_header h = header(fp);
    std::uint64_t last = none;
    auto post = [&](int step, int c, std::size_t k) {
      const auto p = piece(c, k);
      auto bytes = std::as_bytes(p);
      if (half) {
        // the previous send of this piece's wire bytes must be done before they change
        if (ticket[first[c] + k] != none) R.wait_sent(ticket[first[c] + k], deadline(), doing);
        std::byte* w = wire_.data() + 2 * static_cast<std::size_t>(p.data() - x.data());
        parallel::half_wire::compress(fp.wire, p.data(), w, p.size());
        bytes = std::span<const std::byte>(w, 2 * p.size());
      }
      h.step = static_cast<std::uint32_t>(step);
      h.segment = k;
      h.bytes = bytes.size();
      last = ticket[first[c] + k] = R.send(h, bytes);
    };

    const int steps = 2 * (N - 1);
    const bool pre = predivides(fp);
    const bool average = fp.op == ring::op_code::allreduce_average && !pre;
    const T inv_n = T(1) / static_cast<T>(N);
    if (pre) ring::detail::scale(x.data(), inv_n, n);
    for (std::size_t k = 0; k < segments(r); ++k) post(0, r, k);
    for (int s = 0; s < steps; ++s) {
      const int c = mod(r - s - 1);
      for (std::size_t k = 0; k < segments(c); ++k) {
        ring::message m = L.recv(deadline(), doing);
        const auto dst = piece(c, k);
        expect(m, fp, static_cast<std::uint32_t>(s), k, dst.size() * wire_size);
        if (s < N - 1) {
          if (half) parallel::half_wire::decompress<true>(fp.wire, dst.data(), m.payload.data(), dst.size());
          else add_received(dst, m.payload);
          if (s == N - 2 && average) ring::detail::scale(dst.data(), inv_n, dst.size());
          // the owner keeps what the others will receive of its chunk: the same bits everywhere
          if (s == N - 2 && half) parallel::half_wire::round_trip(fp.wire, dst.data(), dst.size());
        } else {
          if (ticket[first[c] + k] != none) R.wait_sent(ticket[first[c] + k], deadline(), doing);
          if (half) parallel::half_wire::decompress<false>(fp.wire, dst.data(), m.payload.data(), dst.size());
          else if (!dst.empty()) std::memcpy(dst.data(), m.payload.data(), dst.size_bytes());
        }
        m = {};  // lets a zero-copy sender reuse its bytes
        if (s + 1 < steps) post(s + 1, c, k);
      }
    }
    if (last != none) R.wait_sent(last, deadline(), doing);
  }

  template <parallel::collective_element T>
  void add_received(std::span<T> dst, std::span<const std::byte> src) {
    if (dst.empty()) return;
    const T* from = reinterpret_cast<const T*>(src.data());
    if (reinterpret_cast<std::uintptr_t>(src.data()) % alignof(T) != 0) {  // ZeroMQ's buffers need not be aligned
      auto& tmp = scratch<T>();
      tmp.resize(dst.size());
      std::memcpy(tmp.data(), src.data(), dst.size_bytes());
      from = tmp.data();
    }
    ring::detail::add_into(dst.data(), from, dst.size());
  }
  template <class T>
  std::vector<T>& scratch() {
    if constexpr (std::same_as<T, float>) return scratch_f_;
    else return scratch_d_;
  }

  /// A pipeline along the ring from root: rank root+1 receives each segment, forwards it to
  /// root+2 before taking the next, and so on; the rank before root only receives.
  template <parallel::broadcast_element T>
  void broadcast_ring(std::span<T> x, int root, const ring::fingerprint& fp) {
    const int N = world_size(), r = rank();
    const std::size_t seg = std::max<std::size_t>(1, link_->segment_bytes(opt_.segment_bytes) / sizeof(T));
    const std::size_t count = std::max<std::size_t>(1, (x.size() + seg - 1) / seg);
    auto piece = [&](std::size_t k) {
      const std::size_t lo = std::min(x.size(), k * seg);
      return x.subspan(lo, std::min(seg, x.size() - lo));
    };
    auto& L = link_->left();
    auto& R = link_->right();
    const std::string doing = ring::to_string(fp);
    const bool forward = (r + 1) % N != root;
    ring::frame_header h = header(fp);
    constexpr auto none = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t last = none;
    for (std::size_t k = 0; k < count; ++k) {
      const auto p = piece(k);
      if (r != root) {
        ring::message m = L.recv(deadline(), doing);
        expect(m, fp, 0, k, p.size_bytes());
        if (!p.empty()) std::memcpy(p.data(), m.payload.data(), p.size_bytes());
      }
      if (r == root || forward) {
        h.segment = k;
        h.bytes = p.size_bytes();
        last = R.send(h, std::as_bytes(p));
      }
    }
    if (last != none) R.wait_sent(last, deadline(), doing);
  }

  /// A token around the ring: N-1 hops, after which each rank has heard (through its
  /// left neighbour) from every other rank since they entered. Also the connect check.
  void token_ring(const ring::fingerprint& fp) {
    const int N = world_size();
    auto& L = link_->left();
    auto& R = link_->right();
    const std::string doing = ring::to_string(fp);
    ring::frame_header h = header(fp);
    std::uint64_t last = R.send(h, {});
    for (int s = 0; s < N - 1; ++s) {
      ring::message m = L.recv(deadline(), doing);
      expect(m, fp, static_cast<std::uint32_t>(s), 0, 0);
      if (s + 1 < N - 1) {
        h.step = static_cast<std::uint32_t>(s + 1);
        last = R.send(h, {});
      }
    }
    R.wait_sent(last, deadline(), doing);
  }

  ring_options opt_;
  std::unique_ptr<ring::zmq_ring> link_;
  std::unique_ptr<ring::mesh> mesh_;  ///< after link_ (whose context its sockets live in): destroyed first
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);  ///< sub-groups hold a weak_ptr: expired once this is destroyed
  std::uint64_t seq_ = 0;
  std::string broken_;
  std::vector<std::byte> wire_;  ///< a two-byte wire: x's segments as they travel
  std::vector<std::byte> gathered_;  ///< allreduce_gather: every rank's buffer as it travelled
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};

static_assert(parallel::communicator<ring_allreduce>);
static_assert(parallel::point_to_point<ring_allreduce>);

}  // namespace gradus

// ring::sub_group and ring_allreduce::split (which needs ring_allreduce complete)
#include "gradus/comm/ring/sub_group.hpp"

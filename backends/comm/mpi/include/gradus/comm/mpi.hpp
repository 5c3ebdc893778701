#pragma once
// gradus::mpi_allreduce — the communicator policy over MPI (target gradus::mpi): for
// clusters that launch their jobs with mpirun / mpiexec or srun --mpi, where MPI's own
// transports (shared memory, InfiniBand, tuned collectives) are the fastest path.
//
//   gradus::mpi_allreduce comm;                           // rank and world from MPI
//   gradus::mpi_allreduce comm(gradus::cluster::from_env());  // ... checked against the spec
//   comm.broadcast(std::span(weights), 0);
//   comm.allreduce_average(std::span(gradients));
//
// Collectives are MPI_Allreduce (MPI_SUM) and MPI_Bcast, in place, on a duplicate of
// MPI_COMM_WORLD (MPI_Comm_dup: gradus' messages never match the program's own). That
// communicator returns its errors (MPI_ERRORS_RETURN) instead of aborting the job, and every
// failing call throws gradus::comm_error naming the operation, the element count and
// dtype, this rank and MPI_Error_string's text. A buffer of more than INT_MAX elements
// (MPI's count is an int) goes in pieces of at most INT_MAX (mpi_options::max_count).
// allreduce_average is the sum scaled by 1/N on every rank: the same bits everywhere when
// MPI's sums are (OpenMPI's allreduce algorithms give every rank the same bits;
// tests/comm/mpi/test_mpi_allreduce.cpp checks it).
//
// Initialization: the first mpi_allreduce of a process calls MPI_Init_thread with
// MPI_THREAD_SERIALIZED (the data-parallel step runs its collectives on a background
// thread) unless the program already initialized MPI, in which case it needs at least that
// level too; a lower level throws gradus::error. MPI is finalized when the last
// mpi_allreduce goes away, and only if an mpi_allreduce initialized it. MPI cannot be
// initialized again after MPI_Finalize: a process makes one mpi_allreduce (or keeps one
// alive) for its whole life; constructing one after that throws gradus::error. A program
// that calls MPI_Init itself keeps control of MPI_Finalize.
//
// Sub-groups: split(color, key) is MPI_Comm_split of the duplicate: the ranks that pass the
// same color get an mpi_allreduce of their own group, ranked by key (ties by their rank
// here). Point-to-point: send(x, to) copies x and starts an MPI_Isend of the copy, so it
// returns at once, as the ring's buffered sends do (a blocking MPI_Send of a message above
// the eager limit waits for the peer's receive: two pipeline stages sending to each other
// at once, activations one way and gradients the other, would wait for each other for
// ever); the copies are freed as their sends complete (tested at every send and receive;
// waited for before the communicator goes). recv(x, from) is MPI_Recv on the duplicate (in
// pieces of max_count, as the collectives) and refuses a message whose element count is not
// x's, naming the peer and both counts.
//
// One thread at a time: two collectives must never run at once (MPI_THREAD_SERIALIZED).
// Unlike ring_allreduce there is no timeout of gradus' own: a dead peer is MPI's to
// report (OpenMPI's mpirun ends the whole job when a rank dies).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: no MPI-2 C++ bindings to compile
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/communicator.hpp"
#include "gradus/parallel/elements.hpp"
#include "gradus/parallel/half_wire.hpp"
#include "gradus/parallel/point_to_point.hpp"

namespace gradus {

/// Settings of an mpi_allreduce (its constructors take them).
struct mpi_options {
  /// Elements per MPI call; a longer buffer goes in pieces (MPI counts are int). Default and
  /// maximum INT_MAX; lower only to test the pieces. 0 or more than INT_MAX: the constructor
  /// throws gradus::error.
  std::size_t max_count = static_cast<std::size_t>(INT_MAX);
};

/// The communicator policy over MPI (target gradus::mpi; `<gradus/comm/mpi.hpp>`): for jobs
/// launched by mpirun / mpiexec or srun `--mpi`. Collectives (parallel::communicator) are
/// MPI_Allreduce (MPI_SUM) and MPI_Bcast, in place, on float and double spans (broadcast also
/// of bytes), any length including 0; split() makes sub-groups (parallel::splittable), and
/// send() / recv() move messages between two ranks (parallel::point_to_point).
///
/// Everything runs on a duplicate of MPI_COMM_WORLD (comm()) whose errors are returned, not
/// fatal: a failing MPI call throws gradus::comm_error naming the operation, the element
/// count and dtype, this rank and MPI's error text. The first mpi_allreduce of a process
/// initializes MPI (MPI_THREAD_SERIALIZED) unless the program did; the last one finalizes
/// it if an mpi_allreduce initialized it, and after MPI_Finalize none can be made (MPI
/// cannot be initialized twice). One call at a time per process (MPI_THREAD_SERIALIZED); there is no timeout of
/// gradus' own: a dead peer is MPI's (or mpirun's) to report. The top of this header has the
/// details.
///
/// ```
/// gradus::mpi_allreduce comm(gradus::cluster::from_env());
/// comm.broadcast(std::span(weights), 0);
/// comm.allreduce_average(std::span(gradients));
/// ```
class mpi_allreduce {
 public:
  /// The communicator's name in messages and in the type-erased holders (`--comm mpi`).
  static constexpr const char* name = "mpi";

  /// Joins MPI_COMM_WORLD: rank and world size are MPI's. Initializes MPI on first use (see
  /// the class); throws gradus::error for a bad `options.max_count`, for an MPI that was
  /// finalized already or gives a thread level below MPI_THREAD_SERIALIZED, and
  /// gradus::comm_error when an MPI call fails.
  explicit mpi_allreduce(mpi_options options = {}) : opt_(options) {
    if (opt_.max_count == 0 || opt_.max_count > static_cast<std::size_t>(INT_MAX))
      throw error("gradus: mpi_allreduce: max_count = " + std::to_string(opt_.max_count) + " (must be 1 ... INT_MAX)");
    acquire();
    try {
      check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
      check(MPI_Comm_size(MPI_COMM_WORLD, &world_), "MPI_Comm_size");
      check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup of MPI_COMM_WORLD");
      check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    } catch (...) {
      if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
      release();
      throw;
    }
  }
  /// From a cluster spec (gradus::cluster::from_env(): under mpirun its OMPI_COMM_WORLD_*
  /// variables): its rank and world size must be MPI's, or the constructor throws naming both.
  template <class Spec>
    requires requires(const Spec& c) {
      { c.rank } -> std::convertible_to<int>;
      { c.world_size } -> std::convertible_to<int>;
    }
  explicit mpi_allreduce(const Spec& cluster, mpi_options options = {}) : mpi_allreduce(options) {
    // (a delegating constructor: the destructor runs when this body throws)
    const int r = static_cast<int>(cluster.rank), n = static_cast<int>(cluster.world_size);
    if (r == rank_ && n == world_) return;
    std::string from = "the cluster spec";
    if constexpr (requires { std::string(cluster.source); }) from += " (" + std::string(cluster.source) + ")";
    throw error("gradus: mpi_allreduce: " + from + " says rank " + std::to_string(r) + " of " + std::to_string(n) +
                ", but MPI says rank " + std::to_string(rank_) + " of " + std::to_string(world_) +
                (r < 0 ? " (this process is not a worker of its cluster spec)" : "") +
                " (launch every rank with mpirun / srun --mpi, and nothing else setting RANK, TF_CONFIG or "
                "GRADUS_CLUSTER)");
  }
  mpi_allreduce(const mpi_allreduce&) = delete;
  mpi_allreduce& operator=(const mpi_allreduce&) = delete;
  /// A group's communicator moves (split returns one); the moved-from one holds none.
  mpi_allreduce(mpi_allreduce&& o) noexcept
      : opt_(o.opt_), comm_(std::exchange(o.comm_, MPI_COMM_NULL)), rank_(o.rank_), world_(o.world_), owns_(std::exchange(o.owns_, false)),
        sends_(std::move(o.sends_)) {}
  mpi_allreduce& operator=(mpi_allreduce&&) = delete;
  ~mpi_allreduce() {
    int finalized = 0;
    MPI_Finalized(&finalized);  // a program that initialized MPI may have finalized it already
    if (!finalized) finish_sends();
    if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
    if (owns_) release();
  }

  /// This process's rank in comm(), 0 ... world_size() - 1.
  int rank() const { return rank_; }
  /// The number of ranks in comm().
  int world_size() const { return world_; }
  /// The duplicated communicator (MPI_ERRORS_RETURN), for a program's own MPI calls.
  MPI_Comm comm() const { return comm_; }

  /// x <- the sum of every rank's x, elementwise.
  template <parallel::collective_element T>
  void allreduce_sum(std::span<T> x) {
    pieces(x, "MPI_Allreduce (sum)", [&](T* p, int n) { return MPI_Allreduce(MPI_IN_PLACE, p, n, type<T>(), MPI_SUM, comm_); });
  }
  /// x <- the sum scaled by 1/N (every rank scales the same bits by the same factor).
  template <parallel::collective_element T>
  void allreduce_average(std::span<T> x) {
    pieces(x, "MPI_Allreduce (average)", [&](T* p, int n) { return MPI_Allreduce(MPI_IN_PLACE, p, n, type<T>(), MPI_SUM, comm_); });
    if (world_ == 1) return;
    const T inv_n = T(1) / static_cast<T>(world_);
    for (auto& v : x) v *= inv_n;
  }
  /// The float average with x travelling as `wire` (parallel::wire_collectives): bf16 or f16
  /// buffers reduced by MPI_Allreduce with an operation that widens both operands, adds them
  /// in fp32 and rounds the sum back (each reduction step sums in fp32); f16 divides by N
  /// before the sum (Horovod's gradient_predivide_factor), bf16 after it. f32 / none: as
  /// allreduce_average(x).
  void allreduce_average(std::span<float> x, element_type wire) {
    if (!parallel::half_wire::is_half(wire)) {
      if (wire != element_type::f32 && wire != element_type::none)
        throw error("gradus: mpi_allreduce: allreduce_average: gradients cannot travel as " + std::string(name_of(wire)) +
                    " (float32, bfloat16 or float16)");
      return allreduce_average(x);
    }
    if (world_ == 1) return;
    const float inv_n = 1.f / static_cast<float>(world_);
    const bool pre = wire == element_type::f16;
    if (pre)
      for (auto& v : x) v *= inv_n;
    auto& w = wire_;  // kept between calls: a bucket's wire buffer, every step
    w.resize(x.size());
    parallel::half_wire::compress(wire, x.data(), reinterpret_cast<std::byte*>(w.data()), x.size());
    MPI_Op op = MPI_OP_NULL;
    check(MPI_Op_create(wire == element_type::bf16 ? &sum_wire<element_type::bf16> : &sum_wire<element_type::f16>, 1, &op),
          "MPI_Op_create");
    const std::string what = "MPI_Allreduce (average as " + std::string(name_of(wire)) + ") of " + std::to_string(x.size()) + " float32";
    int rc = MPI_SUCCESS;
    for (std::size_t at = 0; at < w.size() && rc == MPI_SUCCESS; at += opt_.max_count)
      rc = MPI_Allreduce(MPI_IN_PLACE, w.data() + at, static_cast<int>(std::min(opt_.max_count, w.size() - at)), MPI_UINT16_T, op, comm_);
    MPI_Op_free(&op);
    if (rc != MPI_SUCCESS) fail(rc, what);
    parallel::half_wire::decompress<false>(wire, x.data(), reinterpret_cast<const std::byte*>(w.data()), x.size());
    if (!pre)
      for (auto& v : x) v *= inv_n;
  }
  /// x <- root's x.
  template <parallel::broadcast_element T>
  void broadcast(std::span<T> x, int root) {
    if (root < 0 || root >= world_)
      throw error("gradus: mpi_allreduce: broadcast from rank " + std::to_string(root) + " of a world of " +
                  std::to_string(world_) + " (rank " + std::to_string(rank_) + ")");
    pieces(x, "MPI_Bcast from rank " + std::to_string(root), [&](T* p, int n) { return MPI_Bcast(p, n, type<T>(), root, comm_); });
  }
  /// Returns once every rank has entered it (MPI_Barrier).
  void barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  /// The collectives of this rank's group (every rank calls it): MPI_Comm_split(comm(),
  /// color, key). color >= 0: every rank joins a group.
  mpi_allreduce split(int color, int key) {
    if (color < 0)
      throw error("gradus: mpi_allreduce: split with color " + std::to_string(color) + " (rank " + std::to_string(rank_) +
                  "): a color is >= 0, every rank joins a group");
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split (color " + std::to_string(color) + ", key " + std::to_string(key) + ")");
    return mpi_allreduce(sub, opt_);
  }

  /// x to rank `to`: a copy of x sent by MPI_Isend; returns at once (x may be reused).
  template <parallel::broadcast_element T>
  void send(std::span<const T> x, int to) {
    check_peer(to, "send to");
    reap_sends();
    for (std::size_t at = 0; at < x.size() || at == 0; at += opt_.max_count) {
      const std::size_t n = std::min(opt_.max_count, x.size() - at);
      auto& p = sends_.emplace_back();
      p.bytes.assign(reinterpret_cast<const std::byte*>(x.data() + at), reinterpret_cast<const std::byte*>(x.data() + at + n));
      const int rc = MPI_Isend(p.bytes.data(), static_cast<int>(n), type<T>(), to, p2p_tag, comm_, &p.request);
      if (rc != MPI_SUCCESS) sends_.pop_back();
      check(rc, "MPI_Isend of " + std::to_string(x.size()) + " " + dtype_name<T>() + " to rank " + std::to_string(to));
      if (x.empty()) break;
    }
  }
  /// Sends started and not yet complete (their copies still held).
  std::size_t sends_in_flight() {
    reap_sends();
    return sends_.size();
  }
  /// x <- the next message from rank `from`, which must hold x.size() elements.
  template <parallel::broadcast_element T>
  void recv(std::span<T> x, int from) {
    check_peer(from, "recv from");
    reap_sends();
    for (std::size_t at = 0; at < x.size() || at == 0; at += opt_.max_count) {
      const std::size_t n = std::min(opt_.max_count, x.size() - at);
      const std::string what = "MPI_Recv of " + std::to_string(x.size()) + " " + dtype_name<T>() + " from rank " + std::to_string(from);
      MPI_Status st;
      check(MPI_Probe(from, p2p_tag, comm_, &st), what);
      int got = 0;
      check(MPI_Get_count(&st, type<T>(), &got), what);
      if (got != static_cast<int>(n))
        throw comm_error("gradus: mpi_allreduce: rank " + std::to_string(rank_) + " of " + std::to_string(world_) + " expects " +
                         std::to_string(x.size()) + " " + dtype_name<T>() + " from rank " + std::to_string(from) + ", but its message holds " +
                         (got == MPI_UNDEFINED ? std::string("a different element type") : std::to_string(got)) +
                         (n != x.size() ? " (in the piece at element " + std::to_string(at) + ")" : "") +
                         ": the two ranks disagree on the size or dtype");
      check(MPI_Recv(x.data() + at, static_cast<int>(n), type<T>(), from, p2p_tag, comm_, MPI_STATUS_IGNORE), what);
      if (x.empty()) break;
    }
  }

  /// Whether the next message from rank `from` has arrived (MPI_Iprobe), so that recv would
  /// not wait.
  bool probe(int from) {
    check_peer(from, "probe for");
    reap_sends();
    int flag = 0;
    check(MPI_Iprobe(from, p2p_tag, comm_, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe for a message from rank " + std::to_string(from));
    return flag != 0;
  }

  /// A failing MPI return code (not MPI_SUCCESS) as gradus::comm_error: "gradus:
  /// mpi_allreduce: `<op>` failed on rank r of n: `<MPI_Error_string>`". For a program's own
  /// calls on comm(): comm.check(MPI_Allgather(..., comm.comm()), "MPI_Allgather of 4 float64").
  void check(int rc, const std::string& op) const {
    if (rc != MPI_SUCCESS) fail(rc, op);
  }

 private:
  /// Process-wide: how many mpi_allreduce exist, and whether one of them initialized MPI.
  struct process_state {
    std::mutex m;
    int live = 0;
    bool owned = false;
  };
  static process_state& state() {
    static process_state s;
    return s;
  }

  static void acquire() {
    auto& s = state();
    std::lock_guard lk(s.m);
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (finalized)
      throw error("gradus: mpi_allreduce: MPI was already finalized, and MPI cannot be initialized twice in a process "
                  "(keep one mpi_allreduce alive for the whole program)");
    int provided = MPI_THREAD_SINGLE;
    if (!initialized) {
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        throw comm_error("gradus: mpi_allreduce: MPI_Init_thread failed");
      s.owned = true;
    } else {
      MPI_Query_thread(&provided);
    }
    if (provided < MPI_THREAD_SERIALIZED) {
      if (s.live == 0 && s.owned) {
        MPI_Finalize();
        s.owned = false;
      }
      throw error(std::string("gradus: mpi_allreduce: MPI provides the thread level ") + level_name(provided) +
                  ", below MPI_THREAD_SERIALIZED, which the data-parallel step needs (it runs collectives on a "
                  "background thread)" +
                  (initialized ? "; the program initialized MPI itself: call MPI_Init_thread with MPI_THREAD_SERIALIZED "
                                 "or MPI_THREAD_MULTIPLE"
                               : ""));
    }
    ++s.live;
  }
  static void release() {
    auto& s = state();
    std::lock_guard lk(s.m);
    if (--s.live == 0 && s.owned) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
      s.owned = false;
    }
  }
  static const char* level_name(int level) {
    switch (level) {
      case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
      case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
      case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
      case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
      default: return "(unknown)";
    }
  }

  static constexpr int p2p_tag = 7;  ///< on the duplicate: never the program's messages

  /// A communicator of one group (split): MPI is initialized already; counted as one more user.
  mpi_allreduce(MPI_Comm adopted, mpi_options options) : opt_(options), comm_(adopted) {
    try {
      acquire();
    } catch (...) {
      MPI_Comm_free(&comm_);
      throw;
    }
    try {
      check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank of a split");
      check(MPI_Comm_size(comm_, &world_), "MPI_Comm_size of a split");
      check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler of a split");
    } catch (...) {
      MPI_Comm_free(&comm_);
      release();
      throw;
    }
  }

  void check_peer(int peer, const char* doing) const {
    if (peer < 0 || peer >= world_)
      throw error("gradus: mpi_allreduce: " + std::string(doing) + " rank " + std::to_string(peer) + " of a world of " +
                  std::to_string(world_) + " (rank " + std::to_string(rank_) + ")");
  }

  template <class T>
  static MPI_Datatype type() {
    if constexpr (std::same_as<T, float>) return MPI_FLOAT;
    else if constexpr (std::same_as<T, double>) return MPI_DOUBLE;
    else return MPI_BYTE;
  }
  /// MPI's reduction of two-byte wire values: inout[i] = wire(float(in[i]) + float(inout[i])).
  template <element_type wire>
  static void sum_wire(void* in, void* inout, int* len, MPI_Datatype*) {
    const std::size_t n = static_cast<std::size_t>(*len);
    thread_local std::vector<float> a, b;
    a.resize(n);
    b.resize(n);
    parallel::half_wire::decompress<false>(wire, a.data(), static_cast<const std::byte*>(in), n);
    parallel::half_wire::decompress<false>(wire, b.data(), static_cast<const std::byte*>(inout), n);
    for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
    parallel::half_wire::compress(wire, a.data(), static_cast<std::byte*>(inout), n);
  }
  /// T as errors name it: "float32", "float64", "bytes".
  template <class T>
  static std::string dtype_name() {
    return std::string(parallel::element_name(parallel::element_of<T>));
  }

  /// call(pointer, count) on each piece of at most max_count elements; nothing for none.
  template <class T, class Call>
  void pieces(std::span<T> x, const std::string& op, Call call) {
    for (std::size_t at = 0; at < x.size(); at += opt_.max_count) {
      const std::size_t n = std::min(opt_.max_count, x.size() - at);
      const int rc = call(x.data() + at, static_cast<int>(n));
      if (rc != MPI_SUCCESS) {
        std::string what = op + " of " + std::to_string(x.size()) + " " + dtype_name<T>();
        if (n != x.size()) what += " (the piece of " + std::to_string(n) + " at element " + std::to_string(at) + ")";
        fail(rc, what);
      }
    }
  }
  [[noreturn]] void fail(int rc, const std::string& op) const {
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    std::string why = MPI_Error_string(rc, text, &len) == MPI_SUCCESS ? std::string(text, static_cast<std::size_t>(len))
                                                                      : "MPI error code " + std::to_string(rc);
    throw comm_error("gradus: mpi_allreduce: " + op + " failed on rank " + std::to_string(rank_) + " of " +
                     std::to_string(world_) + ": " + why);
  }

  /// Frees the copies of the sends that completed, oldest first (MPI_Test).
  void reap_sends() {
    while (!sends_.empty()) {
      int done = 0;
      check(MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE), "MPI_Test of a point-to-point send");
      if (!done) break;
      sends_.pop_front();
    }
  }

  /// Before the communicator goes: the sends still in flight, waited for up to 10 s (the
  /// peers' receives take them; without a peer's receive, e.g. when it failed, a send never
  /// completes: its copy is then kept for the process's life, where MPI may still read it,
  /// rather than waited for without end).
  void finish_sends() noexcept {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!sends_.empty()) {
      int done = 0;
      if (MPI_Test(&sends_.front().request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done) {
        sends_.pop_front();
        continue;
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        static std::deque<pending_send> abandoned;  // (one thread at a time: MPI_THREAD_SERIALIZED)
        std::move(sends_.begin(), sends_.end(), std::back_inserter(abandoned));
        sends_.clear();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  struct pending_send {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<std::byte> bytes;  ///< the copy MPI_Isend reads (its heap block stays put as the deque moves)
  };

  mpi_options opt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = -1, world_ = 0;
  bool owns_ = true;  ///< counted in process_state (not a moved-from one)
  std::deque<pending_send> sends_;
  std::vector<std::uint16_t> wire_;  ///< allreduce_average(x, wire): x as it travels
};
static_assert(parallel::communicator<mpi_allreduce>);
static_assert(parallel::splittable<mpi_allreduce>);
static_assert(parallel::point_to_point<mpi_allreduce>);

}  // namespace gradus

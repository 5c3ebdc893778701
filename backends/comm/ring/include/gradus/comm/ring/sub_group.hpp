#pragma once
// ring::sub_group: the collectives and point-to-point of one group of ranks that
// ring_allreduce::split(color, key) made (MPI_Comm_split): a pipeline's data-parallel
// replicas of one stage, say. Included at the end of ring.hpp (it needs ring_allreduce
// complete, and defines ring_allreduce::split); not a header to include alone.
//
//   auto stage = comm.split(/*color=*/rank % 2, /*key=*/rank);   // {0, 2} and {1, 3}
//   stage.allreduce_average(std::span(gradients));               // within the group
//   stage.send(std::span<const float>(x), 1);                    // group ranks
//
// Everything runs over the parent's point-to-point mesh (ring/point_to_point.hpp), on
// channels of the group's own (its collectives and its send/recv apart, and apart from the
// parent's send/recv), so the group's traffic never mixes with anybody else's:
//   - allreduce_sum / allreduce_average: a ring over the members in group-rank order,
//     reduce-scatter then all-gather, one message per chunk and step (the ring's algorithm
//     in ring.hpp, without its segments and data paths). Chunk c is summed in one fixed
//     order by its owner, who also scales an average; the all-gather copies the owner's
//     bits: every member ends with the same bits, whatever the timing.
//   - broadcast: a binomial tree from the root (ceil(log2 N) hops, the whole buffer per hop).
//   - allgather(mine, all): a ring pass of every member's block (all = N blocks, in group-rank order).
//   - barrier: dissemination (ceil(log2 N) rounds of empty messages).
//   - split: the members exchange (color, key) by allgather and split again.
// Collectives must be matched: every member calls the same collectives in the same order
// with the same sizes (each message carries the collective's fingerprint, and a member that
// runs another one is named, as on the ring).
//
// A sub-group refers to its parent: it must not outlive the ring_allreduce it came from
// (using it afterwards throws gradus::error), and it shares the parent's thread rule (one call
// at a time on the parent and all its groups together) and its failures: a comm_error in a
// group breaks the parent, and the reverse. Its timeout is the parent's.
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gradus/comm/ring.hpp"
#include "gradus/comm/ring/point_to_point.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/collectives.hpp"
#include "gradus/parallel/elements.hpp"
#include "gradus/parallel/point_to_point.hpp"

namespace gradus::ring {

/// The collectives (parallel::communicator) and point-to-point of one group of ranks that
/// ring_allreduce::split(color, key) made, as MPI_Comm_split: ranks and roots are group
/// ranks. Everything runs over the parent's point-to-point mesh on the group's own channels;
/// every member ends a collective with the same bits. It must not outlive its parent (using
/// it afterwards throws gradus::error), shares the parent's one-call-at-a-time rule, timeout
/// and failures (a comm_error here breaks the parent, and the reverse). The top of this
/// header has the algorithms.
class sub_group {
 public:
  /// The communicator's name in messages and in the type-erased holders.
  static constexpr const char* name = "ring-group";

  /// Moves the group; the moved-from one has no parent left (using it throws gradus::error).
  sub_group(sub_group&&) noexcept = default;
  /// Moves another group into this one; that one has no parent left (using it throws gradus::error).
  sub_group& operator=(sub_group&&) noexcept = default;
  sub_group(const sub_group&) = delete;
  sub_group& operator=(const sub_group&) = delete;

  /// This rank's rank in the group, 0 ... world_size() - 1 (ordered by split's key).
  int rank() const { return me_; }
  /// How many members the group has.
  int world_size() const { return static_cast<int>(members_.size()); }
  /// The members as ranks of the whole communicator, in group-rank order.
  const std::vector<int>& members() const { return members_; }

  /// x <- the elementwise sum over the group's members; every member ends with the same bits.
  template <parallel::collective_element T>
  void allreduce_sum(std::span<T> x) {
    allreduce(x, op_code::allreduce_sum);
  }
  /// x <- the sum times 1/world_size() (computed once, by the owner of each chunk).
  template <parallel::collective_element T>
  void allreduce_average(std::span<T> x) {
    allreduce(x, op_code::allreduce_average);
  }

  /// x <- group rank root's x.
  template <parallel::broadcast_element T>
  void broadcast(std::span<T> x, int root) {
    (void)parent();
    const int N = world_size();
    if (root < 0 || root >= N)
      throw error("gradus: ring_allreduce: broadcast from rank " + std::to_string(root) + " of a group of " + std::to_string(N) + " (" +
                  label_ + ")");
    const auto fp = next(op_code::broadcast, parallel::element_of<T>, x.size(), root);
    if (N == 1) return;
    const std::string doing = describe(fp);
    parent().run_as([&] { return doing; }, [&] {
      // Binomial tree over v = (rank - root) mod N: v receives from v - 2^b (2^b its lowest
      // set bit), then sends to v + 2^k for every k < b (those below N).
      const int v = (me_ - root + N) % N;
      int mask = 1;
      while (mask < N) {
        if (v & mask) {
          const int from = (v - mask + root) % N;
          const auto& m = take(from, fp, 0, x.size_bytes(), doing);
          if (!x.empty()) std::memcpy(x.data(), m.payload().data(), x.size_bytes());
          drop(from);
          break;
        }
        mask <<= 1;
      }
      for (mask >>= 1; mask > 0; mask >>= 1)
        if (v + mask < N) post((v + mask + root) % N, fp, 0, std::as_bytes(x), doing);
    });
  }

  /// all <- every member's `mine`, in group-rank order (all.size() == world_size() * mine.size()).
  template <parallel::broadcast_element T>
  void allgather(std::span<const T> mine, std::span<T> all) {
    (void)parent();
    const int N = world_size(), r = me_;
    const std::size_t m = mine.size();
    if (all.size() != m * static_cast<std::size_t>(N))
      throw error("gradus: ring_allreduce: allgather of " + std::to_string(m) + " elements per member into " + std::to_string(all.size()) +
                  " in a group of " + std::to_string(N) + " (" + label_ + "): the result holds world_size() x " + std::to_string(m));
    const auto fp = next(op_code::allgather, parallel::element_of<T>, m, 0);
    auto block = [&](int q) { return all.subspan(static_cast<std::size_t>(q) * m, m); };
    if (m && block(r).data() != mine.data()) std::memmove(block(r).data(), mine.data(), m * sizeof(T));
    if (N == 1) return;
    const std::string doing = describe(fp);
    parent().run_as([&] { return doing; }, [&] {  // NOLINT(performance-no-automatic-move): doing is captured by reference and used again: a copy is meant
      // step s: pass member (r - s)'s block to the right, receive member (r - s - 1)'s from the left
      for (int s = 0; s < N - 1; ++s) {
        post(right(), fp, static_cast<std::uint32_t>(s), std::as_bytes(block(mod(r - s))), doing);
        const auto dst = block(mod(r - s - 1));
        const auto& msg = take(left(), fp, static_cast<std::uint32_t>(s), dst.size_bytes(), doing);
        if (!dst.empty()) std::memcpy(dst.data(), msg.payload().data(), dst.size_bytes());
        drop(left());
      }
    });
  }

  /// Returns once every member has entered it.
  void barrier() {
    (void)parent();
    const int N = world_size();
    const auto fp = next(op_code::barrier, element_type::none, 0, 0);
    if (N == 1) return;
    const std::string doing = describe(fp);
    parent().run_as([&] { return doing; }, [&] {  // NOLINT(performance-no-automatic-move): doing is captured by reference and used again: a copy is meant
      // Dissemination: in round k, tell rank + 2^k and hear from rank - 2^k; after
      // ceil(log2 N) rounds each member has heard, through others, from every member.
      std::uint32_t step = 0;
      for (int k = 1; k < N; k <<= 1, ++step) {
        post(mod(me_ + k), fp, step, {}, doing);
        (void)take(mod(me_ - k), fp, step, 0, doing);
        drop(mod(me_ - k));
      }
    });
  }

  /// Point-to-point between group ranks (parallel::point_to_point), as ring_allreduce's own.
  template <parallel::broadcast_element T>
  void send(std::span<const T> x, int to) {
    (void)parent();
    check_member(to, "send to");
    const std::string doing = "send of " + elements(x.size(), parallel::element_of<T>) + " to " + member_name(to) + " in " + label_;
    p2p_header h;
    h.channel = channel_of(id_, false);
    h.dtype = parallel::element_of<T>;
    h.count = x.size();
    parent().run_as([&] { return doing; }, [&] { net().send(members_[static_cast<std::size_t>(to)], h, std::as_bytes(x), deadline(), doing); });
  }
  /// x <- the next message from group rank `from` in this group, which must hold x.size()
  /// elements of T (else gradus::error, the message stays queued), as ring_allreduce::recv.
  template <parallel::broadcast_element T>
  void recv(std::span<T> x, int from) {
    (void)parent();
    check_member(from, "recv from");
    const std::string doing = "recv of " + elements(x.size(), parallel::element_of<T>) + " from " + member_name(from) + " in " + label_;
    const int world_from = members_[static_cast<std::size_t>(from)];
    parent().run_as([&] { return doing; }, [&] {
      const auto& m = net().next(world_from, channel_of(id_, false), deadline(), doing);
      take_payload(m, parallel::element_of<T>, x.size(), std::as_writable_bytes(x), net().prefix(doing), member_name(from));
      net().pop(world_from, channel_of(id_, false));
    });
  }

  /// Whether the next message from group rank `from` in this group has arrived, as
  /// ring_allreduce::probe.
  bool probe(int from) {
    (void)parent();
    check_member(from, "probe");
    const int world_from = members_[static_cast<std::size_t>(from)];
    bool here = false;
    parent().run_as([&] { return "probe for a message from " + member_name(from) + " in " + label_; },
                    [&] { here = net().arrived(world_from, channel_of(id_, false)); });
    return here;
  }

  /// A group of this group's members (every member calls it), as ring_allreduce::split.
  sub_group split(int color, int key) {
    const std::int64_t mine[3] = {color, key, static_cast<std::int64_t>(net().last_group_id)};
    std::vector<std::int64_t> table(3 * members_.size());
    allgather<std::byte>(std::as_bytes(std::span<const std::int64_t>(mine)), std::as_writable_bytes(std::span<std::int64_t>(table)));
    return form(parent(), members_, table, me_, " of " + label_);
  }

 private:
  friend class gradus::ring_allreduce;

  sub_group(ring_allreduce& parent, std::vector<int> members, int me, std::uint32_t id)
      : parent_(&parent), alive_(parent.alive_), members_(std::move(members)), me_(me), id_(id) {
    label_ = "sub-group " + std::to_string(id_) + " (ranks ";
    for (std::size_t i = 0; i < members_.size() && i < 8; ++i) label_ += (i ? ", " : "") + std::to_string(members_[i]);
    label_ += members_.size() > 8 ? ", ... " + std::to_string(members_.size()) + " in all)" : ")";
  }

  /// The group of participant `me` from every participant's (color, key, last group id) in
  /// `table` (participants in their order in the group being split; `ranks`: theirs in the
  /// whole communicator). Every participant computes the same: a negative color throws
  /// gradus::error on each, naming its rank; the new group's id is one past the largest id any
  /// participant has used, so that no two groups sharing a pair of ranks share a channel.
  static sub_group form(ring_allreduce& parent, const std::vector<int>& ranks, const std::vector<std::int64_t>& table, int me,
                        const std::string& of) {
    const std::size_t P = ranks.size();
    std::int64_t last = 0;
    for (std::size_t i = 0; i < P; ++i) {
      if (table[3 * i] < 0)
        throw error("gradus: ring_allreduce: split with color " + std::to_string(table[3 * i]) + " (rank " + std::to_string(i) + of +
                    "): a color is >= 0, every rank joins a group");
      last = std::max(last, table[3 * i + 2]);
    }
    const std::int64_t color = table[3 * static_cast<std::size_t>(me)];
    std::vector<std::size_t> in;
    for (std::size_t i = 0; i < P; ++i)
      if (table[3 * i] == color) in.push_back(i);
    // by key, ties by rank in the group being split (stable: `in` is in that order)
    std::stable_sort(in.begin(), in.end(), [&](std::size_t a, std::size_t b) { return table[3 * a + 1] < table[3 * b + 1]; });
    std::vector<int> members;
    int my_rank = 0;
    for (std::size_t i : in) {
      if (i == static_cast<std::size_t>(me)) my_rank = static_cast<int>(members.size());
      members.push_back(ranks[i]);
    }
    const auto id = static_cast<std::uint32_t>(last + 1);
    parent.mesh_->last_group_id = id;
    return sub_group(parent, std::move(members), my_rank, id);
  }

  ring_allreduce& parent() const {
    if (alive_.expired())
      throw error("gradus: ring_allreduce: " + label_ +
                  " was used after the ring_allreduce it was split from was destroyed: a sub-group must not outlive its parent");
    return *parent_;
  }
  mesh& net() const { return *parent().mesh_; }
  clock::time_point deadline() const { return clock::now() + parent().opt_.timeout; }
  fingerprint next(op_code op, element_type dt, std::size_t count, int root) {
    return fingerprint{++seq_, static_cast<std::uint64_t>(count), op, dt, root};
  }
  std::string describe(const fingerprint& fp) const { return to_string(fp) + " in " + label_; }
  int mod(int a) const {
    const int N = world_size();
    return ((a % N) + N) % N;
  }
  int right() const { return mod(me_ + 1); }
  int left() const { return mod(me_ - 1); }
  std::string member_name(int g) const {
    return "rank " + std::to_string(members_[static_cast<std::size_t>(g)]) + " (rank " + std::to_string(g) + " of the group)";
  }
  void check_member(int g, const char* doing) const {
    if (g < 0 || g >= world_size())
      throw error("gradus: ring_allreduce: " + std::string(doing) + " rank " + std::to_string(g) + " of a group of " +
                  std::to_string(world_size()) + " (" + label_ + ", rank " + std::to_string(me_) + ")");
  }

  /// One message of collective fp, step `step`, to group rank `to`.
  void post(int to, const fingerprint& fp, std::uint32_t step, std::span<const std::byte> bytes, const std::string& doing) {
    p2p_header h;
    h.channel = channel_of(id_, true);
    h.dtype = fp.dtype;  // none (a barrier's, or raw bytes) counts bytes
    h.count = bytes.size() / parallel::element_bytes(h.dtype);
    h.step = step;
    h.fp = fp;
    net().send(members_[static_cast<std::size_t>(to)], h, bytes, deadline(), doing);
  }
  /// The next message of the group's collectives from group rank `from`, which must be
  /// collective fp's step `step` of `bytes` bytes; it stays queued until drop(from).
  const p2p_message& take(int from, const fingerprint& fp, std::uint32_t step, std::size_t bytes, const std::string& doing) {
    const auto& m = net().next(members_[static_cast<std::size_t>(from)], channel_of(id_, true), deadline(), doing);
    const auto& h = m.header;
    if (!(h.fp == fp))
      throw comm_error(net().prefix(doing) + member_name(from) + " is running " + to_string(h.fp) + " but rank " +
                       std::to_string(members_[static_cast<std::size_t>(me_)]) + " is running " + to_string(fp) +
                       ": every member of a group must call the same collectives in the same order with the same sizes");
    if (h.step != step || h.bytes != bytes)
      throw comm_error(net().prefix(doing) + member_name(from) + " sent step " + std::to_string(h.step) + " of " + std::to_string(h.bytes) +
                       " bytes; expected step " + std::to_string(step) + " of " + std::to_string(bytes) + " bytes");
    return m;
  }
  void drop(int from) { net().pop(members_[static_cast<std::size_t>(from)], channel_of(id_, true)); }

  template <parallel::collective_element T>
  void allreduce(std::span<T> x, op_code op) {
    (void)parent();
    const auto fp = next(op, parallel::element_of<T>, x.size(), 0);
    const int N = world_size(), r = me_;
    if (N == 1) return;  // the sum of one; x * (1/1) == x
    const std::string doing = describe(fp);
    parent().run_as([&] { return doing; }, [&] {
      // The ring's chunks (ring.hpp): chunk c is elements [c*n/N, (c+1)*n/N), the first n%N
      // one longer. Step s < N-1 (reduce-scatter): send chunk r-s, add chunk r-s-1 from the
      // left into x; then this member owns the whole sum of chunk r+1. Step N-1+s (all-gather):
      // send chunk r+1-s, overwrite chunk r-s with the left's. Indices mod N.
      const std::size_t n = x.size(), base = n / static_cast<std::size_t>(N), rem = n % static_cast<std::size_t>(N);
      auto chunk = [&](int c) {
        const auto uc = static_cast<std::size_t>(c);
        return x.subspan(uc * base + std::min(uc, rem), base + (uc < rem ? 1 : 0));
      };
      for (int s = 0; s < N - 1; ++s) {
        post(right(), fp, static_cast<std::uint32_t>(s), std::as_bytes(chunk(mod(r - s))), doing);
        const auto dst = chunk(mod(r - s - 1));
        const auto& m = take(left(), fp, static_cast<std::uint32_t>(s), dst.size_bytes(), doing);
        add_received(dst, m.payload());
        drop(left());
      }
      if (op == op_code::allreduce_average) detail::scale(chunk(mod(r + 1)).data(), T(1) / static_cast<T>(N), chunk(mod(r + 1)).size());
      for (int s = 0; s < N - 1; ++s) {
        const auto step = static_cast<std::uint32_t>(N - 1 + s);
        post(right(), fp, step, std::as_bytes(chunk(mod(r + 1 - s))), doing);
        const auto dst = chunk(mod(r - s));
        const auto& m = take(left(), fp, step, dst.size_bytes(), doing);
        if (!dst.empty()) std::memcpy(dst.data(), m.payload().data(), dst.size_bytes());
        drop(left());
      }
    });
  }

  template <parallel::collective_element T>
  void add_received(std::span<T> dst, std::span<const std::byte> src) {
    if (dst.empty()) return;
    const T* from = reinterpret_cast<const T*>(src.data());
    if (reinterpret_cast<std::uintptr_t>(src.data()) % alignof(T) != 0) {  // ZeroMQ keeps small messages inline, unaligned
      auto& tmp = scratch<T>();
      tmp.resize(dst.size());
      std::memcpy(tmp.data(), src.data(), dst.size_bytes());
      from = tmp.data();
    }
    detail::add_into(dst.data(), from, dst.size());
  }
  template <class T>
  std::vector<T>& scratch() {
    if constexpr (std::same_as<T, float>) return scratch_f_;
    else return scratch_d_;
  }

  ring_allreduce* parent_;
  std::weak_ptr<int> alive_;  ///< expired once the parent is destroyed
  std::vector<int> members_;  ///< ranks of the whole communicator, by group rank
  int me_;
  std::uint32_t id_;          ///< channels channel_of(id_, ...)
  std::uint64_t seq_ = 0;     ///< the group's collectives, numbered
  std::string label_;         ///< "sub-group 3 (ranks 0, 2)"
  std::vector<float> scratch_f_;
  std::vector<double> scratch_d_;
};

static_assert(parallel::collectives<sub_group>);
static_assert(parallel::splittable<sub_group>);
static_assert(parallel::point_to_point<sub_group>);

}  // namespace gradus::ring

namespace gradus {

inline ring::sub_group ring_allreduce::split(int color, int key) {
  // Every rank's (color, key, last group id) in its slot of a table all-reduced on the ring:
  // sums of zeros and one integer each, exact in double (and never compressed).
  const auto N = static_cast<std::size_t>(world_size()), r = static_cast<std::size_t>(rank());
  std::vector<double> table(3 * N, 0.0);
  table[3 * r] = color;
  table[3 * r + 1] = key;
  table[3 * r + 2] = static_cast<double>(mesh_->last_group_id);
  allreduce(std::span<double>(table), ring::op_code::split);
  std::vector<std::int64_t> entries(table.size());
  std::transform(table.begin(), table.end(), entries.begin(), [](double v) { return static_cast<std::int64_t>(v); });
  std::vector<int> ranks(N);
  for (std::size_t i = 0; i < N; ++i) ranks[i] = static_cast<int>(i);
  return ring::sub_group::form(*this, ranks, entries, rank(), "");
}

static_assert(parallel::splittable<ring_allreduce>);

}  // namespace gradus

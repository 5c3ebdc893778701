#pragma once
// An in-memory dataset in the spirit of tf.data: examples (float features of one shape,
// int32 labels) held once and shared; shuffle, shard and map give new views of them;
// batch() iterates over minibatches in reusable buffers, optionally prepared ahead on a
// background thread (prefetch).
//
//   auto train = g::data::dataset(std::move(x), g::dims{784}, std::move(y));
//   for (auto [xb, yb] : train.shuffle(seed, epoch).shard(rank, world).batch(64))
//     step.run(x = xb, y = yb);
//   for (auto [xb, yb] : train.batch(64).prefetch(2)) ...
//
// shuffle(seed, epoch): a permutation from std::mt19937_64 seeded with (seed, epoch) and our
// own Fisher-Yates (reproducible across standard libraries). shard(rank, world): example i
// of the current order goes to rank i % world (disjoint, together covering; apply it
// after shuffle with the same seed on every rank). batch(n, drop_remainder): the last
// partial batch is kept unless drop_remainder. The views a batch gives stay valid until
// the iterator moves on.
#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/graph/leaves.hpp"

namespace gradus::data {

/// One batch of a dataset: views into the iterator's buffers, valid until it moves on.
struct minibatch {
  tensor_view<const float> x;         ///< [n, example...]
  tensor_view<const std::int32_t> y;  ///< [n]
};

/// Examples in memory: float features of one shape and an int32 label each, held once and
/// shared by every view that shuffle, shard, map and normalize make (each view copies only
/// its order and its maps, so views are cheap values).
class dataset {
 public:
  /// f(x, examples, example_size): rewrites a batch's features in place, x holding
  /// examples * example_size floats.
  using transform = std::function<void(float* x, index_t examples, index_t example_size)>;

  /// y.size() examples of shape `example`, their features row-major in x, with label y[i]
  /// each. Throws shape_error unless x.size() == y.size() * example.numel() with a
  /// non-empty example, and gradus::error for an example of rank max_rank (a batch adds an
  /// axis).
  dataset(std::vector<float> x, const dims& example, std::vector<std::int32_t> y)
      : store_(std::make_shared<storage>()) {
    adopt(x.size(), "feature values", example, std::move(y));
    store_->x = std::move(x);
  }

  /// Examples stored as bytes (images: a quarter of the memory of float32), each batch's
  /// features computed as byte * scale while they are copied (MNIST: scale 1/255).
  dataset(std::vector<std::uint8_t> x, const dims& example, std::vector<std::int32_t> y, float scale)
      : store_(std::make_shared<storage>()) {
    adopt(x.size(), "feature bytes", example, std::move(y));
    store_->bytes = std::move(x);
    store_->scale = scale;
  }

  /// Examples in this view.
  index_t size() const { return static_cast<index_t>(order_.size()); }
  /// The shape of one example (a batch's features are [n, example_shape()...]).
  const dims& example_shape() const { return store_->example; }
  /// the position of each example of this view in the original data
  const std::vector<std::int64_t>& order() const { return order_; }

  /// This view in an order permuted by a Fisher-Yates shuffle seeded with (seed, epoch):
  /// the same order for the same seed and epoch on every platform and standard library.
  dataset shuffle(std::uint64_t seed, std::uint64_t epoch = 0) const {
    dataset d = *this;
    std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + epoch + 1);
    for (std::size_t i = d.order_.size(); i > 1; --i) std::swap(d.order_[i - 1], d.order_[rng() % i]);
    return d;
  }
  /// Every world-th example of this view from the rank-th on: world shards, disjoint and
  /// together covering it (after a shuffle with the same seed on every rank). Throws
  /// gradus::error unless 0 <= rank < world.
  dataset shard(index_t rank, index_t world) const {
    if (world < 1 || rank < 0 || rank >= world)
      throw error("gradus: dataset::shard: need 0 <= rank < world, got rank " + std::to_string(rank) + ", world " +
                  std::to_string(world));
    dataset d = *this;
    d.order_.clear();
    for (std::size_t i = static_cast<std::size_t>(rank); i < order_.size(); i += static_cast<std::size_t>(world))
      d.order_.push_back(order_[i]);
    return d;
  }
  /// f(x, examples, example_size) runs on each batch's features after they are copied.
  dataset map(transform f) const {
    dataset d = *this;
    d.maps_.push_back(std::move(f));
    return d;
  }
  /// map((x - mean) / stddev) over every feature. Throws gradus::error unless stddev > 0.
  dataset normalize(float mean, float stddev) const {
    if (!(stddev > 0)) throw error("gradus: dataset::normalize: stddev must be > 0");
    return map([mean, inv = 1.0f / stddev](float* x, index_t n, index_t per) {
      for (index_t i = 0; i < n * per; ++i) x[i] = (x[i] - mean) * inv;
    });
  }

  class batches;
  /// This view's minibatches of `size` examples, in order; the last, smaller one is kept
  /// unless drop_remainder. Throws gradus::error when size < 1.
  batches batch(index_t size, bool drop_remainder = false) const;

  /// Copies examples [first, first + n) of this view into xb / yb and applies the maps.
  void fill(index_t first, index_t n, float* xb, std::int32_t* yb) const {
    const index_t per = store_->example.numel();
    for (index_t r = 0; r < n; ++r) {
      const auto src = order_[static_cast<std::size_t>(first + r)];
      if (store_->bytes.empty()) {
        std::copy_n(store_->x.data() + src * per, per, xb + r * per);
      } else {
        const std::uint8_t* b = store_->bytes.data() + src * per;
        const float scale = store_->scale;
        for (index_t i = 0; i < per; ++i) xb[r * per + i] = static_cast<float>(b[i]) * scale;
      }
      yb[r] = store_->y[static_cast<std::size_t>(src)];
    }
    for (const auto& f : maps_) f(xb, n, per);
  }

 private:
  /// Checks that `values` features make y.size() examples of shape `example`, then takes
  /// the labels and the identity order (the features are the caller's to store).
  void adopt(std::size_t values, const char* what, const dims& example, std::vector<std::int32_t> y) {
    const index_t per = example.numel();
    if (example.rank + 1 > max_rank) throw error("gradus: dataset: example rank too large: " + to_string(example));
    if (per <= 0 || static_cast<index_t>(values) != per * static_cast<index_t>(y.size()))
      throw shape_error("gradus: dataset: " + std::to_string(values) + " " + what + " do not make " +
                        std::to_string(y.size()) + " examples of shape " + to_string(example));
    store_->y = std::move(y);
    store_->example = example;
    order_.resize(store_->y.size());
    for (std::size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<std::int64_t>(i);
  }
  struct storage {
    std::vector<float> x;
    std::vector<std::uint8_t> bytes;  ///< or the features as bytes, times scale
    float scale = 1;
    std::vector<std::int32_t> y;
    dims example;
  };
  std::shared_ptr<storage> store_;
  std::vector<std::int64_t> order_;
  std::vector<transform> maps_;
};

/// The minibatches of a dataset view, in order; iterate with a range-for.
class dataset::batches {
 public:
  /// d's batches of `size` examples; drop: leave out the last partial batch. Throws
  /// gradus::error when size < 1.
  batches(dataset d, index_t size, bool drop) : d_(std::move(d)), size_(size), drop_(drop) {
    if (size < 1) throw error("gradus: dataset::batch: size must be >= 1, got " + std::to_string(size));
  }
  /// How many batches an iteration gives.
  index_t count() const { return drop_ ? d_.size() / size_ : (d_.size() + size_ - 1) / size_; }
  /// Examples per batch (the last may hold fewer unless the remainder is dropped).
  index_t batch_size() const { return size_; }
  /// Prepare up to n batches ahead on a background thread.
  batches prefetch(int n) const {
    if (n < 1) throw error("gradus: dataset::prefetch: n must be >= 1, got " + std::to_string(n));
    batches b = *this;
    b.prefetch_ = n;
    return b;
  }

  class iterator;
  /// An iteration from the first batch (with prefetch, its producer thread starts here).
  /// The iterator refers to this object, which must outlive it.
  iterator begin() const;
  /// The end of an iteration: iterator == end() once the last batch is passed.
  std::default_sentinel_t end() const { return {}; }

  /// Batch k into the buffers (k < count()); returns its size.
  index_t fill(index_t k, std::vector<float>& xb, std::vector<std::int32_t>& yb) const {
    const index_t per = d_.example_shape().numel();
    const index_t n = std::min(size_, d_.size() - k * size_);
    xb.resize(static_cast<std::size_t>(size_ * per));
    yb.resize(static_cast<std::size_t>(size_));
    d_.fill(k * size_, n, xb.data(), yb.data());
    return n;
  }
  /// The first n examples of buffers xb / yb (as fill left them) as a minibatch.
  minibatch view(index_t n, const std::vector<float>& xb, const std::vector<std::int32_t>& yb) const {
    dims xs;
    xs.rank = d_.example_shape().rank + 1;
    xs.d[0] = n;
    for (std::size_t i = 0; i < d_.example_shape().rank; ++i) xs.d[i + 1] = d_.example_shape().d[i];
    return {{xb.data(), xs}, {yb.data(), dims{n}}};
  }
  /// Batches prepared ahead (0: none, no thread).
  int prefetch_depth() const { return prefetch_; }

 private:
  dataset d_;
  index_t size_;
  bool drop_;
  int prefetch_ = 0;
};

inline dataset::batches dataset::batch(index_t size, bool drop_remainder) const {
  return batches(*this, size, drop_remainder);
}

/// Without prefetch: fills one pair of buffers in place. With prefetch: a producer thread
/// fills a ring of depth + 1 buffer pairs, at most `depth` ahead of the consumer; the
/// consumer's current batch is never overwritten. The destructor stops the producer (also
/// mid-epoch); an exception in the producer is rethrown by the consumer's next step.
class dataset::batches::iterator {
 public:
  using value_type = minibatch;            ///< what `*it` gives
  using difference_type = std::ptrdiff_t;  ///< required of an input iterator; never used

  iterator() = default;
  /// Positioned on b's first batch (starting the producer thread where b prefetches).
  explicit iterator(const batches* b) : b_(b), st_(std::make_unique<state>()) {
    const int depth = b_->prefetch_depth();
    st_->slots.resize(static_cast<std::size_t>(depth) + 1);
    if (depth > 0) st_->producer = std::thread([s = st_.get(), b = b_] { produce(*s, *b); });
    advance();
  }
  /// Takes over the other iterator's buffers and producer thread.
  iterator(iterator&&) noexcept = default;
  /// Stops this iterator's producer, then takes over o's buffers and producer.
  iterator& operator=(iterator&& o) noexcept {
    if (this != &o) {
      stop();
      b_ = o.b_;
      st_ = std::move(o.st_);
      next_ = o.next_;
      done_ = o.done_;
      cur_ = o.cur_;
    }
    return *this;
  }
  ~iterator() { stop(); }

  /// The current batch: views valid until the iterator moves on.
  minibatch operator*() const { return cur_; }
  /// The next batch (waiting for the producer with prefetch; rethrows its exception).
  iterator& operator++() {
    advance();
    return *this;
  }
  /// As ++it, returning nothing (the iterator is move-only: there is no copy to return).
  void operator++(int) { advance(); }
  /// Whether every batch has been passed.
  bool operator==(std::default_sentinel_t) const { return done_; }

 private:
  struct slot {
    std::vector<float> x;
    std::vector<std::int32_t> y;
    index_t n = 0;
  };
  struct state {
    std::vector<slot> slots;
    std::mutex m;
    std::condition_variable cv;
    index_t produced = 0, consumed = 0;  ///< batches
    bool stopping = false;
    std::exception_ptr err;
    std::thread producer;
  };

  /// Runs on the producer thread; touches only the state and the batches (never the
  /// iterator object, which may move).
  static void produce(state& s, const batches& b) {
    const index_t total = b.count();
    const auto depth = static_cast<index_t>(s.slots.size()) - 1;
    try {
      for (index_t k = 0; k < total; ++k) {
        {
          std::unique_lock lk(s.m);
          // the consumer holds batch `consumed`: batch k may take slot k % (depth + 1)
          // once k - consumed <= depth (at most depth batches ahead)
          s.cv.wait(lk, [&] { return s.stopping || k - s.consumed <= depth; });
          if (s.stopping) return;
        }
        slot& sl = s.slots[static_cast<std::size_t>(k % (depth + 1))];
        sl.n = b.fill(k, sl.x, sl.y);
        {
          std::lock_guard lk(s.m);
          ++s.produced;
        }
        s.cv.notify_all();
      }
    } catch (...) {
      std::lock_guard lk(s.m);
      s.err = std::current_exception();
      s.cv.notify_all();
    }
  }

  void advance() {
    state& s = *st_;
    const index_t total = b_->count();
    if (next_ >= total) {
      done_ = true;
      return;
    }
    const index_t k = next_++;
    if (s.slots.size() == 1) {
      slot& sl = s.slots[0];
      sl.n = b_->fill(k, sl.x, sl.y);
      cur_ = b_->view(sl.n, sl.x, sl.y);
      return;
    }
    const auto ring = static_cast<index_t>(s.slots.size());
    {
      std::unique_lock lk(s.m);
      s.consumed = k;  // batches before k are released
      s.cv.notify_all();
      s.cv.wait(lk, [&] { return s.produced > k || s.err; });
      if (s.produced <= k && s.err) std::rethrow_exception(s.err);
    }
    slot& sl = s.slots[static_cast<std::size_t>(k % ring)];
    cur_ = b_->view(sl.n, sl.x, sl.y);
  }

  void stop() {
    if (!st_ || !st_->producer.joinable()) return;
    {
      std::lock_guard lk(st_->m);
      st_->stopping = true;
    }
    st_->cv.notify_all();
    st_->producer.join();
  }

  const batches* b_ = nullptr;
  std::unique_ptr<state> st_;
  index_t next_ = 0;
  bool done_ = false;
  minibatch cur_{};
};

inline dataset::batches::iterator dataset::batches::begin() const { return iterator(this); }

}  // namespace gradus::data

#pragma once
// minimize(session, loss, optimizer, variables...): a training step.
//
//   auto step = g::minimize(s, loss, g::adam{.lr = 1e-3}, w1, b1, w2, b2);
//   for (...) float l = step.run(x = xb, y = yb);
//
// run() = compute_gradients() + apply_gradients(): one session run of the loss and every
// gradient together (planned once: forward values are shared by the backward pass, the
// whole step allocates nothing after the first), then one fused optimizer pass per
// variable, in place in the session's storage. The split (as TensorFlow's
// compute_gradients / apply_gradients) is where a data-parallel trainer all-reduces the
// gradients between the two.
//
// Constructing the step declares its variables and creates the optimizer's state tensors
// in the session ("w1/momentum", "w1/adam_m", ...), so a checkpoint can be restored into
// the session before the first step.
//
// Sparse-row gradients: a variable read only through embedding_lookup(table, idx) has the
// gradient sparse_rows(updates, idx, table). The step fetches the updates and indices
// instead of the dense table-shaped gradient, coalesces them (the named rows, sorted and
// unique, each the sum of its updates in position order: deterministic) and updates only
// those rows — lazily, as TensorFlow's sparse apply ops and PyTorch's SparseAdam: the
// optimizer state and weight decay of rows the batch did not name stay untouched (plain
// SGD without weight decay gives the dense result, to rounding). set_sparse_as_dense(true)
// scatters them into a dense gradient instead (for a communicator that all-reduces dense
// buffers, as Horovod's sparse_as_dense).
//
// About 620 lines with its doc comments, one concept: the training step (train_step and its minimize factories),
// whose dense and sparse gradient paths share its buffers and hooks and are not split.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gradus/autodiff/grad.hpp"
#include "gradus/exec/session.hpp"
#include "gradus/graph/ops/index.hpp"
#include "gradus/train/loss_scale.hpp"
#include "gradus/train/optimizer.hpp"
#include "gradus/util/trace_span.hpp"

namespace gradus {

/// Whether E is a variable type (`variable<Name, T, Extents...>`), the only leaves minimize() trains.
template <class E>
inline constexpr bool is_variable_v = false;
/// By the tag, not by a partial specialization over variable<N, T, E...>: nvcc's front end
/// does not deduce a class-type template argument (the fixed_string name) there.
template <class X>
  requires requires { typename X::variable_tag; }
inline constexpr bool is_variable_v<X> = true;

namespace detail {
template <class... Vs>
constexpr bool distinct_names() {
  constexpr std::array<std::string_view, sizeof...(Vs)> names{Vs::name.view()...};
  for (std::size_t i = 0; i < names.size(); ++i)
    for (std::size_t j = i + 1; j < names.size(); ++j)
      if (names[i] == names[j]) return false;
  return true;
}
template <class G>
auto as_tuple(G g) {
  if constexpr (requires { std::tuple_size<G>::value; }) return g;
  else return std::tuple<G>{g};
}
/// Whether G is V's sparse-row gradient: sparse_rows(updates, idx, V).
template <class G, class V>
inline constexpr bool is_sparse_grad_v = false;
template <class U, class I, class V>
inline constexpr bool is_sparse_grad_v<gradient_node<scatter_add_node<U, I, V, true>>, V> = true;
/// What a step fetches for one gradient: the gradient, or a sparse one's updates and indices.
template <class V, class G>
auto grad_fetches(const G& g) {
  if constexpr (is_sparse_grad_v<G, V>) return std::tuple(g.e.updates, g.e.idx);
  else return std::tuple<G>{g};
}
}  // namespace detail

/// compute_gradients' hook type when no one listens.
struct no_gradient_hook {
  /// Does nothing.
  template <class B>
  void operator()(std::size_t, const B&) const {}
};

/// What the trainer sees of one gradient between compute and apply (device memory). A
/// sparse one holds `rows` rows of `row_len` values: row k belongs to row indices[k] of the
/// variable (host memory, sorted, unique); dense ones have indices == nullptr.
struct gradient_buffer {
  std::string_view name;   ///< the variable's
  element_type dtype;      ///< f32 or f64
  void* data;              ///< writable: a communicator may reduce into it
  index_t size;            ///< elements in data
  const std::int32_t* indices = nullptr;  ///< sparse: the variable's row of each row of data; dense: nullptr
  index_t rows = 0;                       ///< sparse: rows in data (`size == rows * row_len`); dense: 0
  index_t row_len = 0;                    ///< sparse: elements per row; dense: 0
  bool sparse() const { return indices != nullptr; }  ///< whether it holds sparse rows
};

/// A training step of loss `Loss` over the variables `Vs...` with optimizer `Opt` (sgd, adam,
/// adamw) on session `session<Backend>`; made by minimize(). run() is compute_gradients()
/// (one session run of the loss and every gradient, planned once, allocating nothing after
/// the first step) then apply_gradients() (one fused optimizer pass per variable, in place
/// in the session's storage, then global_step + 1). The split is where a data-parallel
/// trainer all-reduces gradients().
///
/// A variable read only through embedding_lookup has a sparse-row gradient: the step updates
/// only the rows the batch named, lazily (the optimizer state and weight decay of the other
/// rows untouched), unless set_sparse_as_dense(true).
///
/// It refers to the session, which must outlive it; like the session it is not thread-safe.
/// Neither copyable nor movable: keep the one minimize() returns (`auto step = minimize(...)`).
template <class Backend, class Opt, class Loss, class... Vs>
class train_step {
  static_assert(sizeof...(Vs) > 0, "gradus: minimize: name the variables to train");
  static_assert((is_variable_v<Vs> && ...), "gradus: minimize: only variables can be trained (not placeholders)");
  static_assert(detail::distinct_names<Vs...>(), "gradus: minimize: a variable is named twice");
  static_assert(precision_of_backend_t<Backend>::scales_loss || !has_f16_scope<Loss>(),
                "gradus: minimize: in_precision<g::f16>(e) needs a session whose policy scales the loss (small "
                "gradients underflow fp16's 2^-24): g::session<B, g::mixed_fp16>");
  /// Whether the session's precision policy scales the loss (core/precision.hpp: fp16): the
  /// gradients are then those of loss * "loss_scaler/scale", unscaled before the update.
  static constexpr bool scales_loss =
      precision_of_backend_t<Backend>::scales_loss && std::is_same_v<value_t<Loss>, float>;
  static auto backward_loss(const Loss& l) {
    if constexpr (scales_loss) return l * loss_scale_variable{};
    else return l;
  }
  using grads_t = decltype(detail::as_tuple(grad(backward_loss(std::declval<const Loss&>()), std::declval<const Vs&>()...)));
  static constexpr std::size_t max_slots = 2;
  template <std::size_t I>
  using var_t = std::tuple_element_t<I, std::tuple<Vs...>>;
  template <std::size_t I>
  static constexpr bool sparse_v = detail::is_sparse_grad_v<std::tuple_element_t<I, grads_t>, var_t<I>>;
  /// the fetch list: each gradient, or a sparse one's (updates, indices), the last
  /// variable's first — the executor plans outputs in order, so the last layers' gradients
  /// are final early in the backward pass (a data-parallel trainer reduces them meanwhile)
  static constexpr std::size_t rev(std::size_t i) { return sizeof...(Vs) - 1 - i; }
  static auto make_fetches(const grads_t& g) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple_cat(detail::grad_fetches<var_t<rev(I)>>(std::get<rev(I)>(g))...);
    }(std::index_sequence_for<Vs...>{});
  }
  using fetches_t = decltype(make_fetches(std::declval<const grads_t&>()));
  /// per fetch: the gradient it is (dense), or -1 (a sparse gradient's updates or indices)
  static constexpr auto grad_of_fetch = [] {
    std::array<int, std::tuple_size_v<fetches_t>> of{};
    std::size_t k = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((sparse_v<rev(I)> ? (of[k++] = -1, of[k++] = -1) : (of[k++] = static_cast<int>(rev(I)))), ...);
    }(std::index_sequence_for<Vs...>{});
    return of;
  }();
  static constexpr std::array<std::string_view, sizeof...(Vs)> names_{Vs::name.view()...};
  static constexpr std::array<element_type, sizeof...(Vs)> dtypes_{element_type_of<value_t<Vs>>...};
  static constexpr std::array<index_t, sizeof...(Vs)> sizes_{static_dims<shape_t<Vs>>().numel()...};
  static constexpr std::array<index_t, sizeof...(Vs)> row_lens_ = []<std::size_t... I>(std::index_sequence<I...>) {
    return std::array<index_t, sizeof...(Vs)>{
        (sparse_v<I> ? static_dims<shape_t<var_t<I>>>().numel() / static_dims<shape_t<var_t<I>>>()[0] : index_t(0))...};
  }(std::index_sequence_for<Vs...>{});

 public:
  /// How many variables it trains. The arrays below describe them in the order of `Vs...`,
  /// that of gradients() (a trainer plans its gradient buckets from them before the first
  /// step).
  static constexpr std::size_t variable_count = sizeof...(Vs);
  /// The variables' names, `std::array<std::string_view, variable_count>`.
  static constexpr const auto& variable_names() { return names_; }
  /// The variables' element types, f32 or f64, `std::array<element_type, variable_count>`.
  static constexpr const auto& variable_dtypes() { return dtypes_; }
  /// The variables' element counts, `std::array<index_t, variable_count>`.
  static constexpr const auto& variable_sizes() { return sizes_; }
  /// Per variable: the elements of one row when its gradient is a sparse-row one (an
  /// embedding table [rows, ...]: a parameter server moves it as rows), else 0.
  static constexpr const auto& variable_row_lengths() { return row_lens_; }
  /// where gradient I's fetches start in the fetch list
  static constexpr std::array<std::size_t, sizeof...(Vs)> fetch_at = [] {
    std::array<std::size_t, sizeof...(Vs)> at{};
    std::size_t k = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((at[rev(I)] = k, k += sparse_v<rev(I)> ? 2 : 1), ...);
    }(std::index_sequence_for<Vs...>{});
    return at;
  }();

 public:
  using loss_type = value_t<Loss>;  ///< the loss's dtype, float or double: what run() returns

  /// Validates `opt` (its validate(): gradus::error), declares each variable in `s` (see
  /// gradus::declare), and creates the optimizer's state tensors, `"<variable>/<slot>"`,
  /// zero-filled unless `s` has them already, so a checkpoint can be restored into `s` before
  /// the first step. The variables need values (assigned, initialised or restored) only when
  /// the step runs. Prefer minimize().
  train_step(session<Backend>& s, const Loss& loss, const Opt& opt, const Vs&... vs)
      : s_(s), loss_(loss), opt_(opt), grads_(detail::as_tuple(grad(backward_loss(loss), vs...))),
        fetches_(make_fetches(grads_)), scaling_(s) {
    opt_.validate();
    (declare(s_, vs), ...);
    std::size_t i = 0;
    (make_slots(vs, i++), ...);
  }

  /// One training step: the loss before the update.
  template <class... Feeds>
  loss_type run(const Feeds&... feeds) {
    const loss_type l = compute_gradients(feeds...);
    apply_gradients();
    return l;
  }

  /// Forward and backward: the loss, and every gradient in gradients().
  template <class... Feeds>
  loss_type compute_gradients(const Feeds&... feeds) {
    return compute_gradients_hooked(no_gradient_hook{}, feeds...);
  }

  /// compute_gradients, calling on_ready(i, gradients()[i]) as soon as gradient i is final,
  /// while the backward pass goes on (each gradient once; sparse ones after the pass): where
  /// a data-parallel trainer starts all-reducing. The hook must not run the session.
  template <class Hook, class... Feeds>
  loss_type compute_gradients_hooked(Hook&& on_ready, const Feeds&... feeds) {
    constexpr bool hooked = !std::is_same_v<std::remove_cvref_t<Hook>, no_gradient_hook>;
    if (util::trace_sink* const trace = util::active_trace()) trace->begin_step(s_.global_step());
    const util::trace_span span("forward and backward", "train");
    const auto bound = s_.bind();  // the gradients' sparse coalescing goes on the session's stream too
    auto fetch_ready = [&](std::size_t out, void* data) {
      if constexpr (hooked) {
        if (out == 0 || grad_of_fetch[out - 1] < 0) return;  // the loss; a sparse gradient's parts
        const auto i = static_cast<std::size_t>(grad_of_fetch[out - 1]);
        buffers_[i] = {names_[i], dtypes_[i], data, sizes_[i]};
        on_ready(i, buffers_[i]);
      }
    };
    if constexpr (scales_loss) scaling_.before_backward();
    std::apply(
        [&](const auto&... f) {
          auto r = [&] {
            try {
              return s_.run_hooked_on_device(fetch_ready, loss_, f..., feeds...);
            } catch (const numerics_error& e) {
              throw numerics_error(e.what() + reached(e.outputs), e.outputs);
            }
          }();
          [&]<std::size_t... I>(std::index_sequence<I...>) { (take_gradient<I>(r), ...); }(
              std::index_sequence_for<Vs...>{});
          Backend::copy_to_host(&last_loss_, std::get<0>(r).data(), sizeof(loss_type));  // device results
        },
        fetches_);
    if constexpr (hooked) {
      [&]<std::size_t... I>(std::index_sequence<I...>) { (notify_if_sparse<I>(on_ready), ...); }(
          std::index_sequence_for<Vs...>{});
    }
    have_grads_ = true;
    return last_loss_;
  }

  /// Sparse-row gradients as dense ones from the next compute_gradients() on (or back).
  void set_sparse_as_dense(bool on) { sparse_as_dense_ = on; }
  /// Whether sparse-row gradients are scattered into dense ones (default false).
  bool sparse_as_dense() const { return sparse_as_dense_; }

  /// The gradients of the last compute_gradients(), in the order the variables were named.
  std::span<gradient_buffer> gradients() { return buffers_; }

  /// The optimizer's update of every variable (clipping first, if asked), then step + 1.
  void apply_gradients() {
    if (!have_grads_) throw error("gradus: train_step::apply_gradients: no gradients; call compute_gradients first");
    have_grads_ = false;
    const util::trace_span span("optimizer update", "train");
    const auto bound = s_.bind();
    const std::int64_t step = s_.global_step();
    double scale = 1;  // what the update multiplies the gradients by
    if constexpr (scales_loss) {
      if (!scaling_.after_backward(step, buffers_)) {  // Inf or NaN: skipped, scale backed off
        s_.set_global_step(step + 1);
        return;
      }
      scale = scaling_.unscale();
    }
    if (opt_.clip_global_norm > 0) {
      last_norm_ = norm_of_gradients() * scale;
      if (last_norm_ > opt_.clip_global_norm) scale *= opt_.clip_global_norm / last_norm_;
    }
    // each variable's storage, looked up once per step (also for the aliasing check)
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((storage_[I] = s_.template data<value_t<Vs>>(Vs::name.view())), ...);
    }(std::index_sequence_for<Vs...>{});
    [&]<std::size_t... I>(std::index_sequence<I...>) { (update<I>(step, scale), ...); }(std::index_sequence_for<Vs...>{});
    if (s_.check_numerics())
      [&]<std::size_t... I>(std::index_sequence<I...>) { (check_update<I>(step), ...); }(std::index_sequence_for<Vs...>{});
    s_.set_global_step(step + 1);
  }

  /// The global gradient norm of the last step (only computed when clipping).
  double last_global_norm() const { return last_norm_; }
  /// The loss scale the next backward pass uses (train/loss_scale.hpp); 1 where the session's
  /// precision policy does not scale the loss.
  double loss_scale() const {
    if constexpr (scales_loss) return scaling_.scaler().scale();
    else return 1;
  }
  /// Steps skipped for non-finite gradients under loss scaling (0 without it).
  std::int64_t skipped_steps() const {
    if constexpr (scales_loss) return scaling_.scaler().skipped_steps();
    else return 0;
  }
  /// The L2 norm over all gradients of the last compute_gradients() (one extra pass).
  double gradient_norm() const {
    if (!have_grads_) throw error("gradus: train_step::gradient_norm: no gradients; call compute_gradients first");
    const auto bound = s_.bind();
    if constexpr (scales_loss) return norm_of_gradients() * scaling_.unscale();  // of the unscaled gradients
    else return norm_of_gradients();
  }
  /// The learning rate the next update will use.
  double learning_rate() const { return opt_.lr(s_.global_step()); }
  const Opt& optimizer() const { return opt_; }  ///< the optimizer, as given
  const Loss& loss() const { return loss_; }     ///< the loss expression
  /// The gradient expressions, one per variable in order, as a std::tuple (grad(loss, vs...)).
  const grads_t& gradient_expressions() const { return grads_; }
  session<Backend>& owner() const { return s_; }  ///< the session it trains in

 private:
  /// "; it reaches the loss, the gradient of 'w'": the fetches a numerics_error names
  std::string reached(const std::vector<std::size_t>& outs) const {
    std::string r;
    for (std::size_t o : outs) {
      std::string what;
      if (o == 0) what = "the loss";
      else if (grad_of_fetch[o - 1] >= 0) what = "the gradient of '" + std::string(names_[static_cast<std::size_t>(grad_of_fetch[o - 1])]) + "'";
      else
        for (std::size_t i = 0; i < sizeof...(Vs); ++i)
          if (fetch_at[i] == o - 1 || fetch_at[i] + 1 == o - 1) what = "the sparse gradient of '" + std::string(names_[i]) + "'";
      if (r.find(what) == std::string::npos) r += (r.empty() ? "; it reaches " : ", ") + what;
    }
    return r;
  }
  /// after the update of global step `step`: the variable and its optimizer state finite
  template <std::size_t I>
  void check_update(std::int64_t step) {
    using T = value_t<var_t<I>>;
    const index_t n = static_dims<shape_t<var_t<I>>>().numel();
    auto check = [&](const T* p, const std::string& what) {
      const index_t i = Backend::first_nonfinite(p, n);
      if (i < 0) return;
      T v{};
      Backend::copy_to_host(&v, p + i, sizeof(T));
      throw numerics_error("gradus: check_numerics: " + what + " holds " + (v != v ? "NaN" : v > 0 ? "+Inf" : "-Inf") +
                               " at element " + std::to_string(i) + " after the optimizer's update at global step " +
                               std::to_string(step) + " (learning rate " + std::to_string(opt_.lr(step)) + ")",
                           {});
    };
    check(static_cast<const T*>(storage_[I]), detail::quoted("variable ", names_[I]));
    for (int k = 0; k < opt_.slot_count(); ++k)
      check(static_cast<const T*>(slots_[I][static_cast<std::size_t>(k)]),
            detail::quoted("optimizer state ", std::string(names_[I]).append("/").append(opt_.slot_name(k))));
  }

  template <std::size_t I, class Hook>
  void notify_if_sparse(Hook& on_ready) {
    if constexpr (sparse_v<I>) on_ready(I, buffers_[I]);
  }

  /// buffers_[I] from the run's results r (the loss first, then the fetch list).
  template <std::size_t I, class R>
  void take_gradient(R& r) {
    using V = var_t<I>;
    using T = value_t<V>;
    const auto& first = std::get<1 + fetch_at[I]>(r);
    if constexpr (!sparse_v<I>) {
      buffers_[I] = {V::name.view(), element_type_of<T>, const_cast<void*>(static_cast<const void*>(first.data())),
                     first.size()};
    } else {
      const auto& idx = std::get<2 + fetch_at[I]>(r);
      constexpr dims vd = static_dims<shape_t<V>>();
      constexpr index_t vocab = vd.d[0], row_len = vd.numel() / vd.d[0];
      const index_t n = idx.size();
      if (sparse_as_dense_) {
        T* dense = scratch<T>(I, vd.numel());
        Backend::scatter_add(first.data(), idx.data(), n, row_len, dense, vocab);
        buffers_[I] = {V::name.view(), element_type_of<T>, dense, vd.numel()};
        return;
      }
      // coalesce: the named rows sorted and unique; each position's row remapped to its
      // rank there, then one deterministic scatter_add into the compact rows
      auto& sp = sparse_[I];
      sp.idx.resize(static_cast<std::size_t>(n));
      sp.remap.resize(static_cast<std::size_t>(n));
      if (n > 0) Backend::copy_to_host(sp.idx.data(), idx.data(), static_cast<std::size_t>(n) * sizeof(std::int32_t));
      sp.rows.assign(sp.idx.begin(), sp.idx.end());
      std::sort(sp.rows.begin(), sp.rows.end());
      sp.rows.erase(std::unique(sp.rows.begin(), sp.rows.end()), sp.rows.end());
      for (std::size_t i = 0; i < sp.idx.size(); ++i)
        sp.remap[i] = static_cast<std::int32_t>(std::lower_bound(sp.rows.begin(), sp.rows.end(), sp.idx[i]) -
                                                sp.rows.begin());
      const auto k = static_cast<index_t>(sp.rows.size());
      T* rows = scratch<T>(I, k * row_len);
      if (k > 0) {
        auto* remap = static_cast<std::int32_t*>(sp.device_remap.reserve(static_cast<std::size_t>(n) * sizeof(std::int32_t)));
        Backend::copy_to_device(remap, sp.remap.data(), static_cast<std::size_t>(n) * sizeof(std::int32_t));
        Backend::scatter_add(first.data(), remap, n, row_len, rows, k);
      }
      buffers_[I] = {V::name.view(), element_type_of<T>, rows, k * row_len, sp.rows.data(), k, row_len};
    }
  }

  template <std::size_t I>
  const auto* grad_ptr() const {
    using T = value_t<std::tuple_element_t<I, std::tuple<Vs...>>>;
    return static_cast<const T*>(buffers_[I].data);
  }

  double norm_of_gradients() const {
    double sq = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((sq += static_cast<double>(Backend::sum_squares(grad_ptr<I>(), buffers_[I].size))), ...);
    }(std::index_sequence_for<Vs...>{});
    return std::sqrt(sq);
  }

  template <class V>
  void make_slots(const V&, std::size_t i) {
    using T = value_t<V>;
    const dims d = static_dims<shape_t<V>>();
    for (int k = 0; k < opt_.slot_count(); ++k) {
      const std::string slot_name = std::string(V::name.view()) + "/" + std::string(opt_.slot_name(k));
      slots_[i][static_cast<std::size_t>(k)] = s_.template state<T>(slot_name, d);
    }
  }

  template <std::size_t I>
  void update(std::int64_t step, double scale) {
    using T = value_t<std::tuple_element_t<I, std::tuple<Vs...>>>;
    T* w = static_cast<T*>(storage_[I]);
    const T* g = grad_ptr<I>();
    const index_t n = buffers_[I].size;
    // A gradient may be another trained variable's storage itself (d(a*b)/da = b): updating
    // that variable first would change this gradient, so it is read from a copy.
    if (aliases_trained(g, static_cast<std::size_t>(n) * sizeof(T))) {
      T* copy = scratch<T>(I, n);
      Backend::copy(copy, g, static_cast<std::size_t>(n) * sizeof(T));
      g = copy;
    }
    std::array<T*, max_slots> sl{};
    for (std::size_t k = 0; k < max_slots; ++k) sl[k] = static_cast<T*>(slots_[I][k]);
    if (!buffers_[I].sparse()) {
      opt_.template apply<Backend>(n, w, g, sl.data(), step, scale);
      return;
    }
    // the named rows only: gathered with their optimizer state into compact rows, one
    // fused update pass over those, written back
    const index_t k = buffers_[I].rows, len = buffers_[I].row_len;
    if (k == 0) return;
    constexpr index_t vocab = static_dims<shape_t<var_t<I>>>().d[0];
    auto& sp = sparse_[I];
    const auto* rows = static_cast<const std::int32_t*>(sp.device_rows.reserve(static_cast<std::size_t>(k) * sizeof(std::int32_t)));
    Backend::copy_to_device(const_cast<std::int32_t*>(rows), buffers_[I].indices, static_cast<std::size_t>(k) * sizeof(std::int32_t));
    const std::size_t bytes = static_cast<std::size_t>(k * len) * sizeof(T);
    T* wc = static_cast<T*>(sp.compact[0].reserve(bytes));
    Backend::gather(w, vocab, len, rows, k, wc);
    std::array<T*, max_slots> sc{};
    for (std::size_t j = 0; j < max_slots; ++j)
      if (sl[j]) {
        sc[j] = static_cast<T*>(sp.compact[j + 1].reserve(bytes));
        Backend::gather(sl[j], vocab, len, rows, k, sc[j]);
      }
    opt_.template apply<Backend>(k * len, wc, g, sc.data(), step, scale);
    Backend::scatter_rows(wc, rows, k, len, w, vocab);
    for (std::size_t j = 0; j < max_slots; ++j)
      if (sl[j]) Backend::scatter_rows(sc[j], rows, k, len, sl[j], vocab);
  }

  /// Whether [g, g + bytes) overlaps any trained variable's storage.
  bool aliases_trained(const void* g, std::size_t bytes) const {
    const auto* lo = static_cast<const char*>(g);
    for (std::size_t i = 0; i < sizeof...(Vs); ++i) {
      const auto* w = static_cast<const char*>(storage_[i]);
      if (lo < w + storage_bytes_[i] && w < lo + bytes) return true;
    }
    return false;
  }

  template <class T>
  T* scratch(std::size_t i, index_t n) {
    auto& b = scratch_[i];
    const std::size_t bytes = std::max<std::size_t>(static_cast<std::size_t>(n) * sizeof(T), sizeof(T));
    if (b.bytes < bytes) {
      if (b.p) Backend::deallocate(b.p);
      b.p = nullptr;
      b.p = Backend::allocate(bytes);
      b.bytes = bytes;
    }
    return static_cast<T*>(b.p);
  }
  struct buffer {
    void* p = nullptr;
    std::size_t bytes = 0;
  };
  /// a sparse gradient's host-side indices: as fetched, their rank among the named rows,
  /// the named rows (sorted, unique); and the device copy of the ranks
  struct device_bytes {
    void* p = nullptr;
    std::size_t bytes = 0;
    void* reserve(std::size_t want) {
      if (bytes < want) {
        if (p) Backend::deallocate(p);
        p = nullptr;
        p = Backend::allocate(want);
        bytes = want;
      }
      return p;
    }
    device_bytes() = default;
    device_bytes(const device_bytes&) = delete;
    device_bytes& operator=(const device_bytes&) = delete;
    ~device_bytes() {
      if (p) Backend::deallocate(p);
    }
  };
  struct sparse_state {
    std::vector<std::int32_t> idx, remap, rows;
    device_bytes device_remap, device_rows;
    std::array<device_bytes, max_slots + 1> compact;  ///< the named rows of w and its state
  };
  struct scratch_list {
    std::array<buffer, sizeof...(Vs)> b{};
    buffer& operator[](std::size_t i) { return b[i]; }
    scratch_list() = default;
    scratch_list(const scratch_list&) = delete;
    scratch_list& operator=(const scratch_list&) = delete;
    ~scratch_list() {
      for (auto& x : b)
        if (x.p) Backend::deallocate(x.p);
    }
  };

  session<Backend>& s_;
  Loss loss_;
  Opt opt_;
  grads_t grads_;
  fetches_t fetches_;
  std::array<sparse_state, sizeof...(Vs)> sparse_{};
  bool sparse_as_dense_ = false;
  std::array<void*, sizeof...(Vs)> storage_{};  ///< the variables' storage, this step
  static constexpr std::array<std::size_t, sizeof...(Vs)> storage_bytes_{
      static_cast<std::size_t>(static_dims<shape_t<Vs>>().numel()) * sizeof(value_t<Vs>)...};
  std::array<gradient_buffer, sizeof...(Vs)> buffers_{};
  std::array<std::array<void*, max_slots>, sizeof...(Vs)> slots_{};
  scratch_list scratch_;
  struct no_scaling {
    explicit no_scaling(session<Backend>&) {}
  };
  std::conditional_t<scales_loss, step_loss_scaling<Backend>, no_scaling> scaling_;
  loss_type last_loss_{};
  double last_norm_ = 0;
  bool have_grads_ = false;
};

// The variables an expression reads (variables_of_t, below).
namespace detail {
template <class Acc, class... Es>
struct collect_variables {
  using type = Acc;
};
template <class Acc, class E>
struct collect_children {
  using type = Acc;
};
template <class Acc, class... C>
struct collect_children_of;
template <class Acc, class... C>
struct collect_children_of<Acc, std::tuple<C...>> {
  using type = typename collect_variables<Acc, std::remove_cvref_t<C>...>::type;
};
template <class Acc, class E>
  requires requires(const E& e) { e.children(); }
struct collect_children<Acc, E> {
  using type = typename collect_children_of<Acc, children_t<E>>::type;
};
template <class E, class Acc>
struct append_variable {
  using type = typename collect_children<Acc, E>::type;
};
template <class V, class... A>
  requires is_variable_v<V>
struct append_variable<V, std::tuple<A...>> {
  using type = std::conditional_t<(std::is_same_v<A, V> || ...), std::tuple<A...>, std::tuple<A..., V>>;
};
template <class Acc, class E0, class... Es>
struct collect_variables<Acc, E0, Es...> {
  using type = typename collect_variables<typename append_variable<E0, Acc>::type, Es...>::type;
};
}  // namespace detail
/// The variables an expression reads, each once, in order of first appearance (a type
/// list: `std::tuple<variable<...>...>`), found by walking the expression's type.
template <class E>
using variables_of_t = typename detail::collect_variables<std::tuple<>, E>::type;

/// minimize(session, loss, optimizer, variables...): the training step of `loss` over the
/// named variables (see train_step).
template <class Backend, class Opt, expression Loss, class... Vs>
  requires(sizeof...(Vs) > 0)
auto minimize(session<Backend>& s, const Loss& loss, const Opt& opt, const Vs&... vs) {
  static_assert(!is_low_precision_scope_v<Loss>,
                "gradus: minimize: a loss is computed in fp32 whatever the precision (core/precision.hpp), so it "
                "cannot be put in g::in_precision<g::f16 or g::bf16>: put the scope around the layers, or choose "
                "the session's policy (g::session<B, g::mixed_fp16>)");
  return train_step<Backend, Opt, Loss, Vs...>(s, loss, opt, vs...);
}

/// minimize(session, loss, optimizer): over every variable the loss reads (as
/// tf.train.Optimizer.minimize trains all trainable variables). Hold a variable fixed by
/// naming the others explicitly.
template <class Backend, class Opt, expression Loss>
auto minimize(session<Backend>& s, const Loss& loss, const Opt& opt) {
  return [&]<class... Vs>(std::tuple<Vs...>*) {
    static_assert(sizeof...(Vs) > 0, "gradus: minimize: the loss reads no variable");
    return minimize(s, loss, opt, Vs{}...);
  }(static_cast<variables_of_t<Loss>*>(nullptr));
}

}  // namespace gradus

#pragma once
// any_key_value_store: any key-value store (key_value_store.hpp: a parameter server) behind
// one virtual call per operation, so that the data-parallel step is compiled once for all of
// them. It offers the optional parts of the concept whether or not the store has them: a
// store without state initialization takes the variable alone (its optimizer starts fresh),
// one without snapshot is pulled, set_optimizer / set_learning_rate do nothing where the store
// has neither (set_push_type answers false for any type but float32), the sparse-row calls throw "gradus: <name> does not move sparse rows
// (...)" where has_rows() is false, and a store that takes no restarted worker back is never
// restarted() and its join_point() is a barrier.
//
//   auto kv = parallel::any_key_value_store::share(ptr);   // a std::shared_ptr<C>, shared
//                                                          // with any_collectives
// An empty one (default-constructed) is false: no store.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gradus/core/dtype.hpp"
#include "gradus/core/error.hpp"
#include "gradus/parallel/key_value_store.hpp"

namespace gradus::parallel {

/// Any `key_value_store` (key_value_store.hpp: a parameter server) behind one virtual call per
/// operation, so that the data-parallel step is compiled once for every store. It offers the
/// concept's optional parts whether or not the store has them (each call says what it does
/// without). Copies share one store; a default-constructed one holds none (false), and any
/// other call on it is undefined. T is float or double throughout (no other type compiles).
/// The store's errors pass through unchanged.
class any_key_value_store {
  struct iface {
    virtual ~iface() = default;
    virtual const char* name() = 0;
    virtual void initialize(std::string_view, std::span<const float>) = 0;
    virtual void initialize(std::string_view, std::span<const double>) = 0;
    virtual void initialize(std::string_view, std::span<const float>, std::vector<std::span<const float>>, std::int64_t) = 0;
    virtual void initialize(std::string_view, std::span<const double>, std::vector<std::span<const double>>, std::int64_t) = 0;
    virtual void push(std::string_view, std::span<const float>) = 0;
    virtual void push(std::string_view, std::span<const double>) = 0;
    virtual void pull(std::string_view, std::span<float>) = 0;
    virtual void pull(std::string_view, std::span<double>) = 0;
    virtual std::int64_t snapshot(std::string_view, std::span<float>, std::vector<std::span<float>>) = 0;
    virtual std::int64_t snapshot(std::string_view, std::span<double>, std::vector<std::span<double>>) = 0;
    virtual void step_done() = 0;
    virtual void set_optimizer(std::string, std::map<std::string, std::string>) = 0;
    virtual void set_learning_rate(double) = 0;
    virtual bool set_push_type(element_type) = 0;
    virtual bool has_rows() = 0;
    virtual void set_rows(std::string_view, std::size_t) = 0;
    virtual void push_rows(std::string_view, std::span<const std::int64_t>, std::span<const float>) = 0;
    virtual void push_rows(std::string_view, std::span<const std::int64_t>, std::span<const double>) = 0;
    virtual void pull_rows(std::string_view, std::span<float>) = 0;
    virtual void pull_rows(std::string_view, std::span<double>) = 0;
    virtual bool restarted() = 0;
    virtual std::optional<std::int64_t> rejoin_job() = 0;
    virtual std::vector<int> join_point() = 0;
  };
  template <class C>
  struct holder final : iface {
    std::shared_ptr<C> c;
    explicit holder(std::shared_ptr<C> p) : c(std::move(p)) {}
    const char* name() override { return C::name; }
    void initialize(std::string_view k, std::span<const float> x) override { c->initialize(k, x); }
    void initialize(std::string_view k, std::span<const double> x) override { c->initialize(k, x); }
    void push(std::string_view k, std::span<const float> x) override { c->push(k, x); }
    void push(std::string_view k, std::span<const double> x) override { c->push(k, x); }
    void pull(std::string_view k, std::span<float> x) override { c->pull(k, x); }
    void pull(std::string_view k, std::span<double> x) override { c->pull(k, x); }
    void step_done() override { c->step_done(); }
    template <class T>
    void init_state(std::string_view k, std::span<const T> x, std::vector<std::span<const T>> sl, std::int64_t step) {
      if constexpr (requires { c->initialize(k, x, std::move(sl), step); }) c->initialize(k, x, std::move(sl), step);
      else c->initialize(k, x);
    }
    template <class T>
    std::int64_t snap(std::string_view k, std::span<T> x, std::vector<std::span<T>> sl) {
      if constexpr (requires { c->snapshot(k, x, std::move(sl)); }) return c->snapshot(k, x, std::move(sl));
      c->pull(k, x);
      return -1;
    }
    void initialize(std::string_view k, std::span<const float> x, std::vector<std::span<const float>> sl, std::int64_t step) override {
      init_state(k, x, std::move(sl), step);
    }
    void initialize(std::string_view k, std::span<const double> x, std::vector<std::span<const double>> sl, std::int64_t step) override {
      init_state(k, x, std::move(sl), step);
    }
    std::int64_t snapshot(std::string_view k, std::span<float> x, std::vector<std::span<float>> sl) override { return snap(k, x, std::move(sl)); }
    std::int64_t snapshot(std::string_view k, std::span<double> x, std::vector<std::span<double>> sl) override { return snap(k, x, std::move(sl)); }
    void set_optimizer(std::string n, std::map<std::string, std::string> s) override {
      if constexpr (requires { c->set_optimizer(std::move(n), std::move(s)); }) c->set_optimizer(std::move(n), std::move(s));
    }
    bool set_push_type(element_type t) override {
      if constexpr (requires { c->set_push_type(t); }) return c->set_push_type(t);
      else return t == element_type::f32;
    }
    void set_learning_rate(double lr) override {
      if constexpr (requires { c->set_learning_rate(lr); }) c->set_learning_rate(lr);
    }
    template <class F>
    void on_rows(const char* what, F&& f) {
      if constexpr (row_store<C>) f(*c);
      else throw error(std::string("gradus: ") + C::name + " does not move sparse rows (" + what + ")");
    }
    bool has_rows() override { return row_store<C>; }
    void set_rows(std::string_view k, std::size_t n) override { on_rows("set_rows", [&](auto& p) { p.set_rows(k, n); }); }
    void push_rows(std::string_view k, std::span<const std::int64_t> r, std::span<const float> v) override {
      on_rows("push_rows", [&](auto& p) { p.push_rows(k, r, v); });
    }
    void push_rows(std::string_view k, std::span<const std::int64_t> r, std::span<const double> v) override {
      on_rows("push_rows", [&](auto& p) { p.push_rows(k, r, v); });
    }
    void pull_rows(std::string_view k, std::span<float> t) override { on_rows("pull_rows", [&](auto& p) { p.pull_rows(k, t); }); }
    void pull_rows(std::string_view k, std::span<double> t) override { on_rows("pull_rows", [&](auto& p) { p.pull_rows(k, t); }); }
    bool restarted() override {
      if constexpr (rejoin_store<C>) return c->restarted();
      else return false;
    }
    std::optional<std::int64_t> rejoin_job() override {
      if constexpr (rejoin_store<C>) return c->rejoin_job();
      else throw error(std::string("gradus: ") + C::name + " takes no restarted worker back (rejoin_job)");
    }
    std::vector<int> join_point() override {
      if constexpr (rejoin_store<C>) {
        return c->join_point();
      } else if constexpr (requires { c->barrier(); }) {
        c->barrier();
        return {};
      } else {
        throw error(std::string("gradus: ") + C::name + " has no barrier (join_point)");
      }
    }
  };
  std::shared_ptr<iface> p_;

 public:
  any_key_value_store() = default;  ///< none (operator bool: false)
  /// The store c points to, shared with its other holders (any_communicator's collectives).
  template <key_value_store C>
  static any_key_value_store share(std::shared_ptr<C> c) {
    any_key_value_store s;
    s.p_ = std::make_shared<holder<C>>(std::move(c));
    return s;
  }
  /// Whether it holds a store.
  explicit operator bool() const { return p_ != nullptr; }

  /// The store's name, its `C::name` ("parameter_server").
  const char* name() const { return p_->name(); }
  /// Declares variable `key` and offers its first value x (the store keeps the first it gets:
  /// rank 0's). Every worker declares every variable, in the same order, before its first
  /// push or pull.
  template <class T>
  void initialize(std::string_view key, std::span<const T> x) {
    p_->initialize(key, x);
  }
  /// As initialize(key, x), with the optimizer's state tensors (slots, each as long as x)
  /// and the global step: a resumed checkpoint goes on where it stopped. A store without
  /// state initialization takes x alone (its optimizer starts fresh).
  template <class T>
  void initialize(std::string_view key, std::span<const T> x, std::vector<std::span<const T>> slots, std::int64_t step) {
    p_->initialize(key, x, std::move(slots), step);
  }
  /// This worker's gradient x of variable `key` for this step.
  template <class T>
  void push(std::string_view key, std::span<const T> x) {
    p_->push(key, x);
  }
  /// The variable's value into x. When it returns is the store's mode: BSP waits for every
  /// worker's push of this step, bounded staleness for all but the last few steps, async for
  /// nothing.
  template <class T>
  void pull(std::string_view key, std::span<T> x) {
    p_->pull(key, x);
  }
  /// The store's whole state of a variable: its values into x, each optimizer state tensor
  /// into slots; returns the optimizer steps applied. Consistent only while no worker pushes
  /// (between two barriers). A store without snapshots is pulled instead (x only, slots
  /// untouched) and -1 returned.
  template <class T>
  std::int64_t snapshot(std::string_view key, std::span<T> x, std::vector<std::span<T>> slots) {
    return p_->snapshot(key, x, std::move(slots));
  }
  /// This worker's step is over: its clock advances on the store.
  void step_done() { p_->step_done(); }
  /// The optimizer the store applies: its name and its settings() as text, before the first
  /// initialize. Does nothing where the store takes none.
  void set_optimizer(std::string name, std::map<std::string, std::string> settings) { p_->set_optimizer(std::move(name), std::move(settings)); }
  /// The learning rate of the pushes that follow (the worker's schedule at its step). Does
  /// nothing where the store takes none.
  void set_learning_rate(double lr) { p_->set_learning_rate(lr); }
  /// What float gradients travel as in pushes (float32, bfloat16, float16); false where the
  /// store cannot carry that type (its pushes stay float32).
  bool set_push_type(element_type t) { return p_->set_push_type(t); }
  /// Whether the store moves sparse rows (`row_store`: set_rows, push_rows, pull_rows).
  bool has_rows() const { return p_->has_rows(); }
  /// Declares variable `key` a table of rows of row_elements elements (after initialize,
  /// before the first push or pull): push_rows and pull_rows then move rows only. Throws
  /// `error` ("... does not move sparse rows (set_rows)") where has_rows() is false.
  void set_rows(std::string_view key, std::size_t row_elements) { p_->set_rows(key, row_elements); }
  /// A sparse gradient: rows (sorted, unique) and their values, rows.size() rows of the
  /// table's row length. Throws `error` where has_rows() is false.
  template <class T>
  void push_rows(std::string_view key, std::span<const std::int64_t> rows, std::span<const T> values) {
    p_->push_rows(key, rows, values);
  }
  /// Brings table (this worker's whole copy of the variable) up to date, moving only the rows
  /// that changed since its last pull_rows. Waits as pull does. Throws `error` where
  /// has_rows() is false.
  template <class T>
  void pull_rows(std::string_view key, std::span<T> table) {
    p_->pull_rows(key, table);
  }
  /// Whether this process takes the place of a worker the job lost (`rejoin_store`): it must
  /// rejoin_job() before its first push or pull and skip the start-up collectives the others
  /// ran. Always false where the store takes no restarted worker back.
  bool restarted() { return p_->restarted(); }
  /// A restarted worker's return: waits for the workers' next join point, then returns the
  /// step to go on from, or nothing when the job ended first. Throws `error` ("... takes no
  /// restarted worker back (rejoin_job)") where the store takes none.
  std::optional<std::int64_t> rejoin_job() { return p_->rejoin_job(); }
  /// A barrier of every worker where restarted workers waiting in rejoin_job() are taken
  /// back: returns their ranks (every worker then compares the run fingerprint with them).
  /// Call it where every worker stands at the same step with no collective in flight. Where
  /// the store takes no restarted worker back: a plain barrier, returning none (`error` where
  /// it has no barrier either).
  std::vector<int> join_point() { return p_->join_point(); }
};
static_assert(key_value_store<any_key_value_store>);
static_assert(row_store<any_key_value_store>);
static_assert(rejoin_store<any_key_value_store>);

}  // namespace gradus::parallel

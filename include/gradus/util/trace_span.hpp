#pragma once
// Spans of a timeline (the library's side of util/trace.hpp): a trace_span records one
// complete event, its name, category, start, duration and arguments, into the sink installed
// for the process (trace_install), or nothing when none is (one atomic load). The graph
// engine, the training step, the data-parallel step and the pipelines include this header
// only: a span site compiles a clock read and a virtual call, while the recorder behind the
// sink (its containers, its file writing, its JSON) is compiled only where a program makes
// one. Defining GRADUS_NO_TRACE before the includes makes trace_span an empty type and
// active_trace() a constant null: tracing compiles away.
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "gradus/core/text.hpp"  // shortest_text

namespace gradus::util {

/// `s` as a JSON string literal, quotes included (control characters as JSON's six-character escapes).
inline std::string json_quoted(std::string_view s) {
  std::string r;
  r.reserve(s.size() + 2);
  r += '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      r += buf;
    } else {
      r += c;
    }
  }
  r += '"';
  return r;
}

/// The arguments of an event, a JSON object built a member at a time:
/// `trace_args{}.add("bytes", 4096).add("peer", "rank 1")`.
class trace_args {
 public:
  /// Adds `key` with a string value.
  trace_args& add(std::string_view key, std::string_view value) { return member(key, json_quoted(value)); }
  /// Adds `key` with a string value.
  trace_args& add(std::string_view key, const char* value) { return add(key, std::string_view(value)); }
  /// Adds `key` with a string value.
  trace_args& add(std::string_view key, const std::string& value) { return add(key, std::string_view(value)); }
  /// Adds `key` with true or false.
  trace_args& add(std::string_view key, bool value) { return member(key, value ? "true" : "false"); }
  /// Adds `key` with an integer.
  template <std::integral I>
  trace_args& add(std::string_view key, I value) {
    return member(key, std::to_string(value));
  }
  /// Adds `key` with a number (a NaN or an infinity, which JSON cannot hold, is written as null).
  template <std::floating_point F>
  trace_args& add(std::string_view key, F value) {
    return member(key, std::isfinite(value) ? shortest_text(value) : "null");
  }
  /// Whether no argument has been added.
  bool empty() const { return text_.empty(); }
  /// the object's text, "{...}"
  std::string json() const { return "{" + text_ + "}"; }

 private:
  trace_args& member(std::string_view key, const std::string& value) {
    if (!text_.empty()) text_ += ',';
    text_ += json_quoted(key);
    text_ += ':';
    text_ += value;
    return *this;
  }
  std::string text_;
};

/// A small number for the calling thread, the same in every recorder: its trace tid.
inline int trace_thread_id() {
  static std::atomic<int> next{1};
  thread_local const int id = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}

/// What spans record into: a recorder (util/trace.hpp) seen through this interface, so that
/// the library's span sites compile a virtual call, not the recorder's containers, file
/// writing and JSON (the header above says why).
class trace_sink {
 public:
  trace_sink(const trace_sink&) = delete;
  trace_sink& operator=(const trace_sink&) = delete;
  virtual ~trace_sink() = default;
  /// Nanoseconds since the sink was made (a file writes microseconds, to the nanosecond:
  /// Chrome's `ts` and `dur` may have fractions).
  std::int64_t now_ns() const {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - origin_).count();
  }
  /// A complete event: `name` of category `cat` on the calling thread, from `ts` for `dur`
  /// nanoseconds (now_ns()'s clock), with its arguments.
  virtual void complete(std::string_view name, std::string_view cat, std::int64_t ts, std::int64_t dur,
                        const trace_args& args) = 0;
  /// A flow's start (`flow_end` its finish, with the same id and category): drawn as an arrow
  /// from the slice enclosing `ts` on this thread to the slice enclosing the end's time on its
  /// thread (a send to its receive). Ids are the caller's, unique within the category.
  virtual void flow_start(std::string_view name, std::string_view cat, std::uint64_t id, std::int64_t ts) = 0;
  /// A flow's finish: drawn into the slice enclosing `ts` on the calling thread.
  virtual void flow_end(std::string_view name, std::string_view cat, std::uint64_t id, std::int64_t ts) = 0;
  /// Step `step` begins (a training step's boundary; the step begun last, named again, begins
  /// nothing new).
  virtual void begin_step(std::int64_t step) = 0;
  /// Names the calling thread in the viewer ("main", "all-reduce worker", "stage 1").
  virtual void name_thread(std::string_view name) = 0;

 protected:
  trace_sink() : origin_(std::chrono::steady_clock::now()) {}
  std::chrono::steady_clock::time_point origin_;  ///< when the sink was made: time 0
};

namespace detail {
inline std::atomic<trace_sink*>& active_trace_slot() {
  static std::atomic<trace_sink*> slot{nullptr};
  return slot;
}
}  // namespace detail

/// The sink (a recorder) spans record into, or null when none is installed (tracing off; always null
/// where GRADUS_NO_TRACE is defined, so that code testing it compiles away).
inline trace_sink* active_trace() {
#ifndef GRADUS_NO_TRACE
  return detail::active_trace_slot().load(std::memory_order_acquire);
#else
  return nullptr;
#endif
}

/// Installs a recorder for the whole process while it lives (spans on every thread record
/// into it), and restores the one installed before.
class trace_install {
 public:
  /// Installs `r`, which must outlive this object.
  explicit trace_install(trace_sink& r)
      : previous_(detail::active_trace_slot().exchange(&r, std::memory_order_acq_rel)) {}
  trace_install(const trace_install&) = delete;
  trace_install& operator=(const trace_install&) = delete;
  /// Installs the recorder installed before (or none).
  ~trace_install() { detail::active_trace_slot().store(previous_, std::memory_order_release); }

 private:
  trace_sink* previous_;
};

#ifndef GRADUS_NO_TRACE
/// A span of the calling thread, recorded as a complete event into the installed recorder
/// when it ends (nothing when none is installed). `name` and `cat` must outlive the span
/// (string literals, or a graph node's name).
class trace_span {
 public:
  /// Starts the span (the clock read only where a recorder is installed).
  explicit trace_span(std::string_view name, std::string_view cat = "step")
      : r_(active_trace()), name_(name), cat_(cat), t0_(r_ ? r_->now_ns() : 0) {}
  trace_span(const trace_span&) = delete;
  trace_span& operator=(const trace_span&) = delete;
  /// Ends the span: one complete event with its arguments.
  ~trace_span() {
    if (r_) r_->complete(name_, cat_, t0_, r_->now_ns() - t0_, args_);
  }
  /// Adds an argument shown with the span (bytes, peer, micro-batch).
  template <class V>
  trace_span& arg(std::string_view key, const V& value) {
    if (r_) args_.add(key, value);
    return *this;
  }
  /// Whether the span records (a recorder is installed).
  bool on() const { return r_ != nullptr; }

 private:
  trace_sink* r_;
  std::string_view name_, cat_;
  std::int64_t t0_;
  trace_args args_;
};
#else
class trace_span {
 public:
  explicit trace_span(std::string_view, std::string_view = "step") {}
  template <class V>
  trace_span& arg(std::string_view, const V&) {
    return *this;
  }
  bool on() const { return false; }
};
#endif

}  // namespace gradus::util

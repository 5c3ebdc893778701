#pragma once
// A timeline of one process (a rank) in Chrome's Trace Event format, the JSON object form that
// Perfetto and chrome://tracing open: complete ("X") events with their start and duration in
// microseconds, pid = the rank, tid = the recording thread, process and thread names as
// metadata ("M") events, and flow events ("s" / "f") from a send to its receive.
//
//   g::util::trace_recorder rec({.path = "run/trace.json", .rank = 0, .keep_steps = 50});
//   const g::util::trace_install on(rec);          // spans anywhere in the process record here
//   for (step...) {
//     rec.begin_step(step);                        // the ring buffer's step boundary
//     { const g::util::trace_span s("forward", "compute"); ... }
//   }                                              // rec's destructor writes the last flush
//
// Bounded: the recorder keeps the events that end within the last `keep_steps` steps (a
// ring buffer over steps; older events are dropped as each step begins), and at most
// `max_events` (for a program that never begins a step). Readable after a
// kill: the file is replaced whole (written beside it, then renamed over it) at a step
// boundary once `flush_interval_s` has passed since the last flush, and at the end, so it
// is valid JSON at every moment, never half written. Cheap: a span reads the clock twice and
// appends one event under a mutex no other thread holds for long; when no recorder is
// installed a span costs one atomic load. The spans, the sink interface they record into and
// trace_install are util/trace_span.hpp's (what the library's headers include); this header
// adds the recorder.
//
// Timestamps are microseconds on the steady clock since the recorder was made; the file's
// "otherData" holds the Unix time of that origin (microseconds) so that traces of several
// ranks can be put on one clock.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/util/trace_span.hpp"

namespace gradus::util {

/// What a recorder writes and keeps.
struct trace_options {
  std::filesystem::path path = {};  ///< the trace file (replaced whole at each flush)
  int rank = 0;                    ///< the events' pid
  std::string process_name = {};   ///< the process's name in the viewer ("rank N" when empty)
  std::size_t keep_steps = 100;    ///< the ring buffer: events ending in the last this many steps
  double flush_interval_s = 2.0;   ///< at a step boundary, flush when this long has passed
  std::size_t max_events = 1'000'000;  ///< a bound for programs that never begin a step: the oldest go first
};

/// The events of one process and the file they are written to (the header says how).
class trace_recorder final : public trace_sink {
 public:
  /// A recorder writing to `o.path`; throws `error` where the options cannot work (no path,
  /// keep_steps or max_events 0). Nothing is written before the first flush.
  explicit trace_recorder(trace_options o)
      : o_(std::move(o)),
        origin_unix_us_(std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count()),
        last_flush_(origin_) {
    if (o_.path.empty()) throw error("gradus: trace: no file named for the trace (trace_options::path)");
    if (o_.keep_steps == 0) throw error("gradus: trace: keep_steps is 0; keep at least the current step");
    if (o_.max_events == 0) throw error("gradus: trace: max_events is 0; keep at least one event");
    if (o_.process_name.empty()) o_.process_name = "rank " + std::to_string(o_.rank);
  }
  /// Writes the last flush; an error there is reported on stderr (a destructor cannot throw).
  /// Not after a flush that failed: its error has been thrown already.
  ~trace_recorder() override {
    if (failed_) return;
    try {
      flush();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }

  /// A complete event (trace_sink::complete), with its arguments or none.
  void complete(std::string_view name, std::string_view cat, std::int64_t ts, std::int64_t dur,
                const trace_args& args) override {
    add({'X', std::string(name), std::string(cat), ts, dur, trace_thread_id(), 0, args.empty() ? "" : args.json()});
  }
  /// A complete event without arguments.
  void complete(std::string_view name, std::string_view cat, std::int64_t ts, std::int64_t dur) {
    complete(name, cat, ts, dur, trace_args{});
  }
  /// A flow's start (trace_sink::flow_start).
  void flow_start(std::string_view name, std::string_view cat, std::uint64_t id, std::int64_t ts) override {
    add({'s', std::string(name), std::string(cat), ts, 0, trace_thread_id(), id, ""});
  }
  /// A flow's finish (trace_sink::flow_end).
  void flow_end(std::string_view name, std::string_view cat, std::uint64_t id, std::int64_t ts) override {
    add({'f', std::string(name), std::string(cat), ts, 0, trace_thread_id(), id, ""});
  }
  /// An instant event (a marker at one time: a membership change, a skipped step).
  void instant(std::string_view name, std::string_view cat, const trace_args& args = {}) {
    add({'i', std::string(name), std::string(cat), now_ns(), 0, trace_thread_id(), 0, args.empty() ? "" : args.json()});
  }
  /// Names the calling thread in the viewer ("main", "ring sender", "stage 1").
  void name_thread(std::string_view name) override {
    const int tid = trace_thread_id();
    const std::lock_guard lock(m_);
    for (auto& [t, n] : thread_names_)
      if (t == tid) {
        n = std::string(name);
        return;
      }
    thread_names_.emplace_back(tid, std::string(name));
  }

  /// Step `step` begins: events that ended before the step `keep_steps` back began are
  /// dropped, and the file is flushed when `flush_interval_s` has passed since the last flush.
  /// The step the last call began, named again, begins nothing new.
  void begin_step(std::int64_t step) override {
    bool due = false;
    {
      const std::lock_guard lock(m_);
      if (step_count_ > 0 && step == last_step_) return;
      step_starts_.push_back(now_ns());
      ++step_count_;
      if (step_starts_.size() > o_.keep_steps) {
        step_starts_.pop_front();
        const std::int64_t boundary = step_starts_.front();
        // Events are appended as they end, so the front ends first (to within the clock
        // reads of threads racing for the lock): drop from the front while it ends early.
        while (!events_.empty() && events_.front().ts + events_.front().dur < boundary) events_.pop_front();
      }
      last_step_ = step;
      const auto now = std::chrono::steady_clock::now();
      if (std::chrono::duration<double>(now - last_flush_).count() >= o_.flush_interval_s) {
        last_flush_ = now;
        due = true;
      }
    }
    if (due) flush();
  }

  /// Writes every event kept to the file now: written beside it and renamed over it, so the
  /// file is always whole. Throws naming the file when it cannot be written.
  void flush() {
    const std::string text = json();
    const std::lock_guard lock(flush_m_);
    failed_ = true;  // until the file is in place
    const std::filesystem::path& file = o_.path;
    std::filesystem::path tmp = file;
    tmp += ".tmp." + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      if (f) f.write(text.data(), static_cast<std::streamsize>(text.size()));
      if (!f) {
        std::error_code ignored;
        std::filesystem::remove(tmp, ignored);
        throw error("gradus: cannot write the trace file '" + file.string() + "' (through '" + tmp.string() +
                    "'): is its directory there and writable?");
      }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, file, ec);
    if (ec) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw error("gradus: cannot replace the trace file '" + file.string() + "': " + ec.message());
    }
    failed_ = false;
  }

  /// The trace as the file holds it (the JSON object form).
  std::string json() const {
    const std::lock_guard lock(m_);
    const std::string pid = std::to_string(o_.rank);
    std::string s = "{\"traceEvents\":[\n";
    s += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"name\":" +
         json_quoted(o_.process_name) + "}}";
    s += ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":0,\"args\":{\"sort_index\":" +
         pid + "}}";
    for (const auto& [tid, name] : thread_names_)
      s += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + pid + ",\"tid\":" + std::to_string(tid) +
           ",\"args\":{\"name\":" + json_quoted(name) + "}}";
    for (const event& e : events_) {
      s += ",\n{\"name\":" + json_quoted(e.name) + ",\"cat\":" + json_quoted(e.cat) + ",\"ph\":\"";
      s += e.ph;
      s += "\",\"ts\":" + microseconds(e.ts) + ",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.tid);
      if (e.ph == 'X') s += ",\"dur\":" + microseconds(e.dur);
      if (e.ph == 's' || e.ph == 'f') s += ",\"id\":" + std::to_string(e.id);
      if (e.ph == 'f') s += ",\"bp\":\"e\"";
      if (e.ph == 'i') s += ",\"s\":\"t\"";
      if (!e.args.empty()) s += ",\"args\":" + e.args;
      s += '}';
    }
    s += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":" + pid +
         ",\"clock_origin_unix_us\":" + std::to_string(origin_unix_us_) +
         ",\"steps_seen\":" + std::to_string(step_count_) + ",\"last_step\":" + std::to_string(last_step_) +
         ",\"keep_steps\":" + std::to_string(o_.keep_steps) + "}}\n";
    return s;
  }

  /// How many events the ring buffer holds now.
  std::size_t size() const {
    const std::lock_guard lock(m_);
    return events_.size();
  }
  /// The options it was made with.
  const trace_options& options() const { return o_; }

 private:
  struct event {
    char ph;
    std::string name, cat;
    std::int64_t ts, dur;  ///< nanoseconds
    int tid;
    std::uint64_t id;
    std::string args;  ///< a JSON object's text, or empty
  };
  /// `ns` nanoseconds as microseconds with three decimals ("1234.567").
  static std::string microseconds(std::int64_t ns) {
    if (ns < 0) return "-" + microseconds(-ns);
    const std::string frac = std::to_string(1000 + ns % 1000);  // "1xyz": the leading zeros kept
    return std::to_string(ns / 1000) + "." + frac.substr(1);
  }
  void add(event e) {
    const std::lock_guard lock(m_);
    if (events_.size() >= o_.max_events) events_.pop_front();
    events_.push_back(std::move(e));
  }

  trace_options o_;
  std::int64_t origin_unix_us_;
  mutable std::mutex m_;   ///< the events, the steps, the thread names
  std::mutex flush_m_;     ///< one flush at a time (they share the temporary's name)
  bool failed_ = false;    ///< the last flush threw (under flush_m_)
  std::deque<event> events_;
  std::deque<std::int64_t> step_starts_;  ///< when each of the last keep_steps steps began (ns)
  std::vector<std::pair<int, std::string>> thread_names_;
  std::int64_t step_count_ = 0, last_step_ = -1;
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace gradus::util

#pragma once
// A training progress bar in the manner of Keras' Progbar. On a terminal it keeps one live
// line, rewritten in place (at most every `refresh_s` seconds, 0.1 by default):
//
//   epoch 2/3  412/938 [============>.................] - ETA 3s - loss 0.2345 - 21034 samples/s
//
// and ends each epoch with the line in its final state plus the epoch's metrics. Anywhere
// else (a file, a pipe, CI logs) it never writes a carriage return: one plain line every
// `every` steps (0: none) and one at the end of each epoch,
//
//   epoch 2/3 step 400/938 loss 0.2345 samples/s 21034 eta_s 3.1
//   epoch 2/3 step 938/938 loss 0.2011 samples/s 20876 seconds 2.9 test_accuracy 0.9612
//
// The loss shown is the mean of the steps so far in the epoch. step() is what the training
// loop calls: a few additions and a clock read, and output only when it is due.
//
//   g::util::progress bar(std::cerr, g::util::is_terminal(std::cerr));
//   bar.start_epoch(e + 1, epochs, batches);
//   for (...) bar.step(step.run(x = xb, y = yb), xb.shape().d[0]);
//   bar.stop();                                  // the evaluation is not training time
//   bar.end_epoch({{"test_accuracy", evaluate()}});
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <iostream>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

#include <unistd.h>

namespace gradus::util {

/// Whether `os` is std::cout or std::cerr / std::clog writing to a terminal.
inline bool is_terminal(const std::ostream& os) {
  if (&os == &std::cout) return ::isatty(STDOUT_FILENO) != 0;
  if (&os == &std::cerr || &os == &std::clog) return ::isatty(STDERR_FILENO) != 0;
  return false;
}

/// Seconds on std::chrono::steady_clock.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// A training progress bar in the manner of Keras' Progbar: live, one line redrawn in place
/// with a carriage return (for a terminal); plain, one line every `options::every` steps and
/// one per epoch, never a carriage return (for files, pipes and CI logs). Call start_epoch(),
/// step() per batch, optionally stop() before an evaluation, then end_epoch(metrics). The
/// loss shown is the mean of the epoch's steps so far. Not thread-safe.
class progress {
 public:
  /// How often and how wide it draws.
  struct options {
    std::int64_t every = 0;               ///< plain mode: a line every this many steps (0: epoch ends only)
    double refresh_s = 0.1;               ///< live mode: the least time between two redraws, in seconds
    int width = 30;                       ///< live mode: characters of the bar
    double (*clock)() = &steady_seconds;  ///< the time in seconds; tests pass a fake one
  };

  /// A bar writing to `out`, live (redrawn in place) or plain; pass is_terminal(out) to
  /// choose by where out goes. Default options.
  progress(std::ostream& out, bool live) : progress(out, live, options{}) {}
  /// As above, with options `o`. `out` must outlive the bar.
  progress(std::ostream& out, bool live, options o) : out_(&out), live_(live), o_(o) {}

  /// epoch is 1-based; steps is the number of steps the epoch will have.
  void start_epoch(int epoch, int epochs, std::int64_t steps) {
    epoch_ = epoch;
    epochs_ = epochs;
    total_ = steps;
    done_ = 0;
    samples_ = 0;
    loss_sum_ = 0;
    t0_ = o_.clock();
    stopped_ = false;
    next_draw_ = t0_ + o_.refresh_s;
    last_len_ = 0;
    if (live_) draw(t0_, false);
  }

  /// One step of the epoch: its loss and how many samples it took (for samples/s). Draws
  /// only when due: live, at most every `refresh_s` seconds; plain, every `every` steps.
  void step(double loss, std::int64_t samples) {
    ++done_;
    samples_ += samples;
    loss_sum_ += loss;
    if (live_) {
      const double now = o_.clock();
      if (now >= next_draw_) {
        next_draw_ = now + o_.refresh_s;
        draw(now, false);
      }
    } else if (o_.every > 0 && done_ % o_.every == 0 && done_ < total_) {
      plain(o_.clock(), false, {});
    }
  }

  /// Stops the epoch's clock (before an evaluation that its time and rate should not count).
  void stop() {
    stopped_at_ = o_.clock();
    stopped_ = true;
  }

  /// Ends the epoch's line (live) or writes its plain line, with these metrics appended; the
  /// time is the stop() time when there was one.
  void end_epoch(std::initializer_list<std::pair<std::string_view, double>> metrics = {}) {
    const double now = stopped_ ? stopped_at_ : o_.clock();
    stopped_ = false;
    seconds_ = now - t0_;
    if (live_) {
      std::string line = bar_line(now, true);
      for (const auto& [k, v] : metrics) {
        line += " - ";
        line += k;
        line += ' ';
        line += number(v, 4);
      }
      *out_ << '\r' << line << pad(line.size()) << '\n' << std::flush;
      last_len_ = 0;
    } else {
      plain(now, true, metrics);
    }
  }

  std::int64_t steps_done() const { return done_; }       ///< steps of the current epoch so far
  std::int64_t samples_done() const { return samples_; }  ///< samples of the current epoch so far
  /// The mean loss of the current epoch's steps (0 before the first).
  double mean_loss() const { return done_ ? loss_sum_ / static_cast<double>(done_) : 0.0; }
  double epoch_seconds() const { return seconds_; }  ///< the duration of the last ended epoch, in seconds
  bool live() const { return live_; }                ///< whether it redraws one line in place

 private:
  static std::string number(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
  }
  double rate(double now) const {
    const double dt = now - t0_;
    return dt > 0 ? static_cast<double>(samples_) / dt : 0.0;
  }
  double eta(double now) const {
    if (done_ == 0) return 0;
    return (now - t0_) / static_cast<double>(done_) * static_cast<double>(std::max<std::int64_t>(total_ - done_, 0));
  }
  static std::string duration(double s) {
    const auto t = static_cast<std::int64_t>(std::lround(s));
    if (t < 60) return std::to_string(t) + "s";
    if (t < 3600) return std::to_string(t / 60) + "m" + (t % 60 < 10 ? "0" : "") + std::to_string(t % 60) + "s";
    return std::to_string(t / 3600) + "h" + (t / 60 % 60 < 10 ? "0" : "") + std::to_string(t / 60 % 60) + "m";
  }
  std::string bar_line(double now, bool final) const {
    std::string s = "epoch " + std::to_string(epoch_) + "/" + std::to_string(epochs_) + "  ";
    const std::string tot = std::to_string(total_), cur = std::to_string(done_);
    s += std::string(tot.size() > cur.size() ? tot.size() - cur.size() : 0, ' ') + cur + "/" + tot + " [";
    const int w = std::max(o_.width, 1);
    const auto filled =
        total_ > 0 ? static_cast<int>(static_cast<double>(w) * static_cast<double>(std::min(done_, total_)) /
                                      static_cast<double>(total_))
                   : w;
    for (int i = 0; i < w; ++i) s += i < filled ? '=' : (i == filled ? '>' : '.');
    s += "]";
    // appended piece by piece: g++ 12 warns falsely (-Wrestrict) on "literal" + std::string&&
    s += final ? " - " : " - ETA ";
    s += final ? duration(now - t0_) : done_ > 0 ? duration(eta(now)) : std::string("?");
    if (done_ > 0) {
      s += " - loss ";
      s += number(mean_loss(), 4);
    }
    s += " - ";
    s += number(rate(now), 0);
    s += " samples/s";
    return s;
  }
  std::string pad(std::size_t len) {
    std::string p = last_len_ > len ? std::string(last_len_ - len, ' ') : std::string();
    last_len_ = len;
    return p;
  }
  void draw(double now, bool final) {
    const std::string line = bar_line(now, final);
    *out_ << '\r' << line << pad(line.size()) << std::flush;
  }
  void plain(double now, bool final, std::initializer_list<std::pair<std::string_view, double>> metrics) {
    std::string s = "epoch " + std::to_string(epoch_) + "/" + std::to_string(epochs_) + " step " +
                    std::to_string(done_) + "/" + std::to_string(total_) + " loss " + number(mean_loss(), 4) +
                    " samples/s " + number(rate(now), 0);
    s += final ? " seconds " : " eta_s ";
    s += number(final ? now - t0_ : eta(now), 1);
    for (const auto& [k, v] : metrics) {
      s += ' ';
      s += k;
      s += ' ';
      s += number(v, 4);
    }
    *out_ << s << '\n' << std::flush;
  }

  std::ostream* out_;
  bool live_;
  options o_;
  int epoch_ = 0, epochs_ = 0;
  std::int64_t total_ = 0, done_ = 0, samples_ = 0;
  double loss_sum_ = 0, t0_ = 0, next_draw_ = 0, seconds_ = 0, stopped_at_ = 0;
  bool stopped_ = false;
  std::size_t last_len_ = 0;
};

}  // namespace gradus::util

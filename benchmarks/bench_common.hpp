#pragma once
// Timing for the benchmarks: median of interleaved rounds.
//
// Why not Google Benchmark: this machine is shared (other people compile on its two
// cores), so background load comes in bursts. Google Benchmark runs all repetitions of
// one benchmark back to back, so a burst lands on one implementation and skews the
// ratio between two of them. Here every round runs each implementation once (in a
// rotating order), so all of them see the same background, and the median over rounds
// drops the rounds a burst hit. The tables also need ratios across implementations,
// which a Google Benchmark reporter does not give without post-processing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace bench {

struct candidate {
  std::string name;
  std::function<void()> run;  // one sample (may loop over several calls)
  std::vector<double> seconds{};
  std::function<void()> before{};  // if set: runs before every sample, untimed (a reset)
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Runs every candidate `warmup` times (first runs plan, allocate and fault pages in),
// then `rounds` rounds of one sample each, rotating the order every round. A candidate's
// `before` runs ahead of each of its samples, outside the timed interval.
inline void run_interleaved(std::vector<candidate>& cs, int rounds, int warmup = 2) {
  for (int w = 0; w < warmup; ++w)
    for (auto& c : cs) {
      if (c.before) c.before();
      c.run();
    }
  const std::size_t n = cs.size();
  for (int r = 0; r < rounds; ++r)
    for (std::size_t k = 0; k < n; ++k) {
      auto& c = cs[(k + static_cast<std::size_t>(r)) % n];
      if (c.before) c.before();
      const auto t0 = std::chrono::steady_clock::now();
      c.run();
      const auto t1 = std::chrono::steady_clock::now();
      c.seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
    }
}

// How busy the machine was with other processes while a benchmark ran: CPU time of all
// processes (/proc/stat) minus this process's own (/proc/self/stat), as a share of all
// cores' time. Printed with each table, so a run disturbed by other work shows it.
class background_load {
 public:
  background_load() : start_(sample()) {}
  double percent() const {
    const auto [total, busy, self] = sample();
    const double dt = static_cast<double>(total - start_.total);
    const double others = static_cast<double>((busy - start_.busy) - (self - start_.self));
    return dt > 0 ? std::max(0.0, 100.0 * others / dt) : 0.0;
  }

 private:
  struct ticks {
    long long total = 0, busy = 0, self = 0;
  };
  static ticks sample() {
    ticks t;
    std::ifstream st("/proc/stat");
    std::string cpu;
    long long v[8] = {};
    st >> cpu;
    for (auto& x : v) st >> x;
    for (auto x : v) t.total += x;
    t.busy = t.total - v[3] - v[4];  // minus idle and iowait
    // /proc/self/stat: utime and stime are fields 14 and 15, after "(comm)".
    std::ifstream ss("/proc/self/stat");
    std::string line;
    std::getline(ss, line);
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    std::string field;
    for (int i = 3; i <= 13; ++i) rest >> field;
    long long ut = 0, stime = 0;
    rest >> ut >> stime;
    t.self = ut + stime;
    return t;
  }
  ticks start_;
};

}  // namespace bench

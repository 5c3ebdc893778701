#pragma once
// cpu_simd's threads: how many a pass may use, and how many it does use on a machine that
// other processes also load.
//
// Two numbers:
//   threads()  the thread count the results are defined by: set_threads(n), else
//              OMP_NUM_THREADS (OpenMP's default). Work that a thread count partitions
//              (cpu_simd::split_k's slices of a long inner dimension) is cut by it, so a
//              run's bits depend on it and on nothing else.
//   team()     the OpenMP threads the next parallel pass starts: threads(), less one for
//              every core that other processes keep busy.
// Why the team adapts: a pass ends at a barrier that waits for its slowest thread. When
// another process holds a core, one of our threads waits for a time slice and the rest spin
// at the barrier (libgomp spins ~300,000 iterations before sleeping, which is what makes it
// fast on idle cores), so an epoch of mnist_mlp that takes 0.1 s on two idle cores took
// 1.1 s with one core busy, and 72 s while a compiler ran on both. OMP_WAIT_POLICY=passive
// stops the spinning but costs 45% on idle cores; a shorter GOMP_SPINCOUNT does not help
// (benchmarks/README.md, "Busy machines"). libgomp's own OMP_DYNAMIC sizes the team from
// the 15-minute load average, which counts our own threads and reacts in minutes.
//
// So the governor samples, at most every 250 ms (from session::run's hook, one clock read
// otherwise), the busy time of the CPUs this process may run on (/proc/stat) less this
// process's own CPU time (/proc/self/stat): the cores other processes hold. A core counts as
// taken when others use ≥ 60% of it and free again below 40% (hysteresis, so a load near
// one half does not flip the team every sample). The team is threads() less the taken
// cores, at least 1. On idle cores it is threads(): the idle speed is the default's.
//
// On by default; GRADUS_ADAPTIVE_THREADS=0 (or set_adaptive_threads(false)) keeps the team at
// threads(); pin_team(n) fixes it at n (0: back to threads(), or adaptive when on). Where
// /proc is missing (not Linux) the team stays at threads(). The team never changes a bit of
// the results: every pass cuts its work by threads() (fused passes element by element,
// GEMMs into blocks of one-thread OpenBLAS calls, cpu_simd::gemm), and a smaller team
// runs the same pieces, more of them per thread. (Until issue 15's block split, OpenBLAS
// threaded its own GEMMs, and its multi-threaded driver blocks K differently from its
// single-threaded one: a team that shrank mid-run changed the weights.)
#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace gradus::cpu_threads {

/// Busy and total jiffies summed over some CPUs' lines of /proc/stat ("cpuN user nice system
/// idle iowait irq softirq steal ..."). Busy: user, nice, system, irq, softirq and steal (a
/// hypervisor's other guests hold the core as surely as a process does); idle and iowait are
/// free. Lines of CPUs not in `cpus` (the affinity mask) are skipped; the aggregate "cpu "
/// line is skipped. ok is false when no wanted line was found.
/// Reads up to cap bytes of a small kernel file (/proc, /sys) into buf; the bytes read (0
/// when it cannot be opened).
inline std::size_t read_file(const char* path, char* buf, std::size_t cap) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  std::size_t n = 0;
  while (n < cap) {
    const ssize_t r = ::read(fd, buf + n, cap - n);
    if (r <= 0) break;
    n += static_cast<std::size_t>(r);
  }
  ::close(fd);
  return n;
}

struct cpu_times {
  std::uint64_t busy = 0, total = 0;
  bool ok = false;
};

inline cpu_times parse_proc_stat(std::string_view text, const std::vector<int>& cpus) {
  cpu_times t;
  std::size_t pos = 0;
  while (pos < text.size()) {
    const std::size_t eol = std::min(text.find('\n', pos), text.size());
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (line.size() < 4 || line.substr(0, 3) != "cpu") {
      if (t.ok) break;  // the cpu lines come first
      continue;
    }
    if (line[3] < '0' || line[3] > '9') continue;  // the aggregate line
    std::size_t i = 3;
    int id = 0;
    while (i < line.size() && line[i] >= '0' && line[i] <= '9') id = id * 10 + (line[i++] - '0');
    if (!cpus.empty() && !std::binary_search(cpus.begin(), cpus.end(), id)) continue;
    std::uint64_t f[8] = {};
    for (int k = 0; k < 8; ++k) {
      while (i < line.size() && line[i] == ' ') ++i;
      if (i >= line.size() || line[i] < '0' || line[i] > '9') break;
      std::uint64_t v = 0;
      while (i < line.size() && line[i] >= '0' && line[i] <= '9') v = v * 10 + static_cast<std::uint64_t>(line[i++] - '0');
      f[k] = v;
    }
    t.busy += f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
    t.total += f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7];
    t.ok = true;
  }
  return t;
}

/// utime + stime (jiffies, every thread of the process) from /proc/self/stat: fields 14 and
/// 15, counted after the command name's closing parenthesis (the name may hold spaces).
inline std::int64_t parse_self_stat(std::string_view text) {
  const std::size_t close = text.rfind(')');
  if (close == std::string_view::npos) return -1;
  std::size_t i = close + 1;
  std::int64_t v[2] = {-1, -1};
  for (int field = 3; field <= 15 && i < text.size(); ++field) {  // field 3 is the state
    while (i < text.size() && text[i] == ' ') ++i;
    const std::size_t start = i;
    while (i < text.size() && text[i] != ' ') ++i;
    if (field >= 14) {
      std::int64_t x = 0;
      for (std::size_t k = start; k < i; ++k) {
        if (text[k] < '0' || text[k] > '9') return -1;
        x = x * 10 + (text[k] - '0');
      }
      v[field - 14] = x;
    }
  }
  return v[0] < 0 || v[1] < 0 ? -1 : v[0] + v[1];
}

/// The decision, apart from where the numbers come from (tested on its own). `others`: the
/// cores other processes used over the last window (busy core-seconds / seconds).
class governor_state {
 public:
  /// Cores counted as taken after this window: up when others ≥ taken + 0.6, down when
  /// others < taken - 0.6 (i.e. a fractional core counts from 60% and until below 40%).
  int observe(double others) {
    const int up = static_cast<int>(std::floor(others + 0.4));
    const int down = static_cast<int>(std::floor(others + 0.6));
    if (up > taken_) taken_ = up;
    else if (down < taken_) taken_ = std::max(0, down);
    return taken_;
  }
  int taken() const { return taken_; }
  /// The team for a thread count of `threads` on `cpus` usable cores.
  static int team(int threads, int cpus, int taken) {
    if (taken <= 0) return threads;
    return std::clamp(std::min(threads, cpus - taken), 1, std::max(1, threads));
  }

 private:
  int taken_ = 0;
};

class governor {
 public:
  static governor& instance() {
    static governor g;
    return g;
  }

  bool adaptive() const { return adaptive_.load(std::memory_order_relaxed); }
  void set_adaptive(bool on) { adaptive_.store(on, std::memory_order_relaxed); }
  int pinned() const { return pinned_.load(std::memory_order_relaxed); }
  void pin(int n) { pinned_.store(std::max(0, n), std::memory_order_relaxed); }
  int cpus() const { return static_cast<int>(cpus_.size()); }
  int taken() const { return taken_.load(std::memory_order_relaxed); }

  /// At most every `period`: read the two files and update the taken cores. Returns them.
  int sample(std::chrono::steady_clock::time_point now) {
    const std::int64_t t = now.time_since_epoch().count();
    if (t - last_.load(std::memory_order_relaxed) < period_ticks_ || !available_.load(std::memory_order_relaxed))
      return taken();
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || t - last_.load(std::memory_order_relaxed) < period_ticks_) return taken();
    last_.store(t, std::memory_order_relaxed);
    const cpu_times c = read_cpu_times();
    const std::int64_t own = read_own_time();
    if (!c.ok || own < 0) {
      available_ = false;
      return taken();
    }
    if (have_prev_ && c.total > prev_.total) {
      const double total = static_cast<double>(c.total - prev_.total);
      const double busy = static_cast<double>(c.busy - prev_.busy);
      const double mine = static_cast<double>(own - prev_own_);
      // total jiffies / cpus = the window's length in jiffies
      const double others = std::max(0.0, busy - mine) / (total / static_cast<double>(cpus()));
      taken_.store(state_.observe(others), std::memory_order_relaxed);
    }
    prev_ = c;
    prev_own_ = own;
    have_prev_ = true;
    return taken();
  }

  int team_for(int threads) const {
    if (const int p = pinned(); p > 0) return std::min(p, threads);
    if (!adaptive()) return threads;
    return governor_state::team(threads, cpus(), taken());
  }

 private:
  governor() {
    if (const char* e = std::getenv("GRADUS_ADAPTIVE_THREADS"); e && (std::string_view(e) == "0" || std::string_view(e) == "false" || std::string_view(e) == "off"))
      adaptive_ = false;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int i = 0; i < CPU_SETSIZE; ++i)
        if (CPU_ISSET(i, &set)) cpus_.push_back(i);
    }
    if (cpus_.empty()) available_ = false;
    period_ticks_ = std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::milliseconds(250)).count();
    // A first reading (last_ is 0: it is due), so the first decision comes one period later.
    sample(std::chrono::steady_clock::now());
  }
  cpu_times read_cpu_times() {
    // The cpu lines come first (under ~120 bytes each); the interrupt counts after them
    // can be long and are not read.
    buffer_.resize(256 + 160 * static_cast<std::size_t>(cpus_.empty() ? 1 : cpus_.back() + 1));
    const std::size_t n = read_file("/proc/stat", buffer_.data(), buffer_.size());
    return parse_proc_stat(std::string_view(buffer_.data(), n), cpus_);
  }
  std::int64_t read_own_time() {
    char buf[1024];
    const std::size_t n = read_file("/proc/self/stat", buf, sizeof buf);
    return n ? parse_self_stat(std::string_view(buf, n)) : -1;
  }

  std::atomic<bool> adaptive_{true};
  std::atomic<int> pinned_{0};
  std::atomic<int> taken_{0};
  std::atomic<std::int64_t> last_{0};
  std::int64_t period_ticks_ = 0;
  std::vector<int> cpus_;
  std::atomic<bool> available_{true};
  std::mutex mutex_;
  governor_state state_;
  cpu_times prev_;
  std::int64_t prev_own_ = 0;
  bool have_prev_ = false;
  std::vector<char> buffer_;
};

/// The size in bytes of the highest-level data or unified cache in front of the first CPU
/// this process may run on, from /sys/devices/system/cpu/cpuN/cache/index*/{level,type,size}
/// ("32768K"); 0 where Linux does not say. `root` is that directory's parent (a test's own).
inline std::size_t last_level_cache_bytes(const std::string& root = "/sys/devices/system/cpu") {
  cpu_set_t set;
  CPU_ZERO(&set);
  int cpu = 0;
  if (sched_getaffinity(0, sizeof set, &set) == 0)
    while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, &set)) ++cpu;
  auto read = [](const std::string& path) {
    char buf[64];
    std::string s(buf, read_file(path.c_str(), buf, sizeof buf));
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  };
  int best_level = 0;
  std::size_t best = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = root + "/cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(i) + "/";
    const std::string level = read(dir + "level"), type = read(dir + "type"), size = read(dir + "size");
    if (level.empty()) break;
    if (type == "Instruction" || size.empty()) continue;
    std::size_t v = 0, at = 0;
    while (at < size.size() && size[at] >= '0' && size[at] <= '9') v = v * 10 + static_cast<std::size_t>(size[at++] - '0');
    if (at < size.size()) v <<= size[at] == 'K' ? 10 : size[at] == 'M' ? 20 : size[at] == 'G' ? 30 : 0;
    const int l = std::atoi(level.c_str());
    if (l > best_level && v > 0) {
      best_level = l;
      best = v;
    }
  }
  return best;
}

/// Per calling thread (OpenMP's thread count is a per-thread setting): the thread count its
/// results are defined by, and the team last given to OpenMP.
inline thread_local int tl_threads = 0;
inline thread_local int tl_team = 0;

inline int threads() {
  if (tl_threads <= 0) tl_threads = omp_get_max_threads();  // before any team was set here
  return tl_threads;
}

/// Runs f with OpenBLAS on the calling thread alone. OpenBLAS's OpenMP build (Debian's
/// libopenblas0-openmp, 0.3.21) uses omp_get_max_threads() threads whenever it is called
/// outside an active parallel region (it resets its own count to OpenMP's on every call,
/// so openblas_set_num_threads(1) does not hold), and one thread inside one. Outside, the
/// calling thread's OpenMP count is 1 for the call and put back after: a cheap ICV store.
template <class F>
void blas_on_one_thread(F&& f) {
  if (omp_in_parallel()) return f();
  const int keep = omp_get_max_threads();
  if (keep == 1) return f();
  omp_set_num_threads(1);
  f();
  omp_set_num_threads(keep);
}

inline void apply_team(int team) {
  if (team == tl_team) return;
  omp_set_num_threads(team);
  tl_team = team;
}

inline void set_threads(int n) {
  tl_threads = std::max(1, n);
  tl_team = 0;
  apply_team(governor::instance().team_for(tl_threads));
}

/// session::run's hook: one clock read, and every 250 ms a sample.
inline void before_run() {
  const int t = threads();
  governor& g = governor::instance();
  if (g.adaptive() && g.pinned() == 0) g.sample(std::chrono::steady_clock::now());
  apply_team(g.team_for(t));
}

inline int team() { return governor::instance().team_for(threads()); }

}  // namespace gradus::cpu_threads

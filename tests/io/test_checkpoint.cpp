#define BOOST_TEST_MODULE io_checkpoint
// Checkpoints: save, restore into a fresh session, continue training — bit-identical to
// an uninterrupted run (variables, Adam state, the step counter and the schedule it
// drives); a mismatched checkpoint is refused with every difference listed and the
// session left untouched; failed saves leave the previous checkpoint intact.
#include <boost/test/unit_test.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/io/checkpoint.hpp>

namespace g = gradus;
namespace fs = std::filesystem;

namespace {

g::placeholder<"x", float, g::dyn, 20> x;
g::placeholder<"y", std::int32_t, g::dyn> y;
g::variable<"dense1/w", float, 20, 16> w1;
g::variable<"dense1/b", float, 16> b1;
g::variable<"dense2/w", float, 16, 4> w2;
g::variable<"dense2/b", float, 4> b2;
g::variable<"dense2/w", float, 16, 5> w2_wide;  // same name, other shape
g::variable<"extra", double, 3> extra;

auto model_loss() {
  return g::mean(g::softmax_cross_entropy(g::matmul(g::tanh(g::matmul(x, w1) + b1), w2) + b2, y));
}
auto optimizer() { return g::adam{.lr = g::cosine_lr(0.05, 40, 5, 0.001), .clip_global_norm = 2.0}; }

void init(g::session<g::cpu_simd>& s) {
  g::initialize(s, w1, g::init::glorot_uniform{}, 11);
  g::initialize(s, b1, g::init::zeros{}, 11);
  g::initialize(s, w2, g::init::glorot_uniform{}, 11);
  g::initialize(s, b2, g::init::constant{0.1}, 11);
}

struct batches {
  std::vector<std::vector<float>> xs;
  std::vector<std::vector<std::int32_t>> ys;
  batches() {
    std::mt19937 r(5);
    std::normal_distribution<float> n(0, 1);
    for (int b = 0; b < 20; ++b) {
      xs.emplace_back(32 * 20);
      ys.emplace_back(32);
      for (auto& v : xs.back()) v = n(r);
      for (std::size_t i = 0; i < 32; ++i) ys.back()[i] = static_cast<std::int32_t>((xs.back()[i * 20] > 0) * 2 + (xs.back()[i * 20 + 1] > 0));
    }
  }
};

template <class Step>
void train(Step& st, const batches& data, int from, int to) {
  for (int b = from; b < to; ++b)
    st.run(x = g::view(data.xs[static_cast<std::size_t>(b)].data(), {32, 20}),
           y = g::view(data.ys[static_cast<std::size_t>(b)].data(), {32}));
}

std::map<std::string, std::vector<std::byte>> snapshot(const g::session<g::cpu_simd>& s) {
  std::map<std::string, std::vector<std::byte>> r;
  for (const auto& e : s.entries()) {
    const std::size_t bytes = static_cast<std::size_t>(e.shape.numel()) * (e.dtype == "float64" ? 8u : 4u);
    r[std::string(e.name)].assign(static_cast<const std::byte*>(e.data), static_cast<const std::byte*>(e.data) + bytes);
  }
  return r;
}

struct temp_dir {
  fs::path p = fs::temp_directory_path() / ("gradus_ckpt_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(p); }
  ~temp_dir() { fs::remove_all(p); }
};

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const g::error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

BOOST_AUTO_TEST_CASE(resume_is_bit_identical) {
  temp_dir dir;
  const batches data;
  // uninterrupted: 20 steps
  g::session<g::cpu_simd> a;
  init(a);
  auto sa = g::minimize(a, model_loss(), optimizer(), w1, b1, w2, b2);
  train(sa, data, 0, 20);

  // interrupted after 8 steps, saved, restored into a new session, 12 more
  const fs::path file = dir.p / "ckpt.npz";
  {
    g::session<g::cpu_simd> b;
    init(b);
    auto sb = g::minimize(b, model_loss(), optimizer(), w1, b1, w2, b2);
    train(sb, data, 0, 8);
    g::save_checkpoint(b, file);
  }
  g::session<g::cpu_simd> c;
  auto sc = g::minimize(c, model_loss(), optimizer(), w1, b1, w2, b2);  // declares, no values
  g::restore_checkpoint(c, file);
  BOOST_TEST(c.global_step() == 8);
  train(sc, data, 8, 20);

  BOOST_TEST(c.global_step() == 20);
  const auto ra = snapshot(a), rc = snapshot(c);
  BOOST_TEST(ra.size() == 12u);  // 4 variables, 2 Adam tensors each
  for (const auto& [name, bytes] : ra) {
    BOOST_TEST_CONTEXT(name) {
      BOOST_REQUIRE(rc.count(name) == 1u);
      BOOST_TEST((bytes == rc.at(name)), "bit-identical");
    }
  }
  // and training changed something: not a trivially equal pair of untouched sessions
  g::session<g::cpu_simd> fresh;
  init(fresh);
  BOOST_TEST((snapshot(fresh).at("dense1/w") != ra.at("dense1/w")));
}

BOOST_AUTO_TEST_CASE(mismatches_are_listed_and_nothing_is_restored) {
  temp_dir dir;
  const fs::path file = dir.p / "ckpt.npz";
  {
    g::session<g::cpu_simd> s;
    init(s);
    auto st = g::minimize(s, model_loss(), optimizer(), w1, b1, w2, b2);
    g::save_checkpoint(s, file);
  }
  // a graph whose dense2/w is wider, without dense2/b, with an extra variable
  g::session<g::cpu_simd> t;
  g::initialize(t, w1, g::init::constant{7}, 1);
  g::initialize(t, b1, g::init::zeros{}, 1);
  g::initialize(t, w2_wide, g::init::zeros{}, 1);
  g::initialize(t, extra, g::init::zeros{}, 1);
  const auto before = snapshot(t);
  const std::string msg = error_of([&] { g::restore_checkpoint(t, file); });
  BOOST_TEST_MESSAGE(msg);
  BOOST_TEST(msg.find("ckpt.npz") != std::string::npos);
  BOOST_TEST(msg.find("'dense2/w': the session has (16, 5) float32, the file (16, 4) float32") != std::string::npos);
  BOOST_TEST(msg.find("missing from the file: 'extra' (3,) float64") != std::string::npos);
  BOOST_TEST(msg.find("not in the session: 'dense2/b' (4,) float32") != std::string::npos);
  BOOST_TEST(msg.find("not in the session: 'dense1/w/adam_m' (20, 16) float32") != std::string::npos);
  BOOST_TEST(msg.find("nothing was restored") != std::string::npos);
  BOOST_TEST((snapshot(t) == before));  // dense1/w still all 7s
}

BOOST_AUTO_TEST_CASE(saving_refuses_unset_variables_and_failures_keep_the_old_file) {
  temp_dir dir;
  const fs::path file = dir.p / "ckpt.npz";
  g::session<g::cpu_simd> s;
  init(s);
  g::save_checkpoint(s, file);
  std::ifstream in(file, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  BOOST_TEST(good.size() > 0u);

  g::session<g::cpu_simd> u;
  u.declare(w1);
  BOOST_TEST(error_of([&] { g::save_checkpoint(u, file); }).find("variable 'dense1/w' has no value yet") !=
             std::string::npos);
  BOOST_TEST(error_of([&] { g::save_checkpoint(s, dir.p / "no" / "such" / "dir" / "c.npz"); }).find("c.npz") !=
             std::string::npos);
  std::ifstream again(file, std::ios::binary);
  BOOST_TEST((std::string((std::istreambuf_iterator<char>(again)), {}) == good));
  // no temporary files left behind
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& f : fs::directory_iterator(dir.p)) ++files;
  BOOST_TEST(files == 1u);

  // a truncated checkpoint is an error naming the file, and restores nothing
  const fs::path cut = dir.p / "cut.npz";
  {
    std::ofstream o(cut, std::ios::binary);
    o.write(good.data(), static_cast<std::streamsize>(good.size() / 2));
  }
  g::session<g::cpu_simd> r;
  init(r);
  const auto before = snapshot(r);
  BOOST_TEST(error_of([&] { g::restore_checkpoint(r, cut); }).find("cut.npz") != std::string::npos);
  BOOST_TEST((snapshot(r) == before));
}

#define BOOST_TEST_MODULE io_weights
// Weights for inference (io/weights.hpp): a training checkpoint (Adam state, step counter)
// loads into a fresh inference session of the forward graph alone, which then computes the
// training session's outputs bit for bit; save_weights writes the variables and nothing
// else; every refusal (a missing variable, another shape, the transpose, another dtype,
// NaN, an extra array, a pipeline stage's file, a session with no variables) names the
// file and the tensor and leaves the session as it was.
#include <boost/test/unit_test.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/io/checkpoint.hpp>
#include <gradus/io/weights.hpp>

#include "io_test_model.hpp"

namespace g = gradus;
namespace fs = std::filesystem;

namespace {

using namespace gradus::test;  // the model, init, snapshot, temp_dir, error_of

std::vector<float> inputs(int rows, unsigned seed) {
  std::mt19937 r(seed);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> v(static_cast<std::size_t>(rows) * 20);
  for (auto& e : v) e = n(r);
  return v;
}

// The forward outputs of the session on 32 fixed rows, as bits.
std::vector<float> forward(g::session<g::cpu_simd>& s) {
  const auto in = inputs(32, 9);
  const auto out = s.run(logits(), x = g::view(in.data(), {32, 20}));
  return {out.data(), out.data() + out.size()};
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A session trained 5 Adam steps, and its checkpoint (variables, adam_m, adam_v, global_step).
struct trained {
  g::session<g::cpu_simd> s;
  explicit trained(const fs::path& file, const g::checkpoint_options& o = {}) {
    init(s);
    auto step = g::minimize(s, loss(), g::adam{.lr = 0.05});
    for (unsigned b = 0; b < 5; ++b) {
      const auto in = inputs(32, b);
      std::vector<std::int32_t> labels(32);
      for (std::size_t i = 0; i < 32; ++i) labels[i] = static_cast<std::int32_t>((in[i * 20] > 0) * 2 + (in[i * 20 + 1] > 0));
      step.run(x = g::view(in.data(), {32, 20}), y = g::view(labels.data(), {32}));
    }
    g::save_checkpoint(s, file, o);
  }
};

// The file's arrays after f(arrays), written to `to`.
void edit(const fs::path& from, const fs::path& to, auto&& f) {
  auto arrays = g::io::read_npz(from);
  f(arrays);
  std::vector<g::io::npz_array_ref> refs;
  for (const auto& a : arrays) refs.push_back({a.name, a.dtype, a.shape, a.bytes.data()});
  g::io::write_npz(to, refs);
}

g::io::npz_array& array_named(std::vector<g::io::npz_array>& arrays, const std::string& name) {
  for (auto& a : arrays)
    if (a.name == name) return a;
  BOOST_FAIL("no array " + name);
  return arrays.front();
}

std::set<std::string> names_in(const fs::path& file) {
  std::set<std::string> r;
  for (const auto& a : g::io::read_npz(file)) r.insert(a.name);
  return r;
}

}  // namespace

BOOST_AUTO_TEST_CASE(a_training_checkpoint_loads_into_an_inference_session) {
  temp_dir dir("weights");
  const fs::path file = dir.p / "ckpt.npz";
  trained t(file);
  BOOST_TEST(names_in(file).count("dense1/w/adam_m") == 1u);  // a real training checkpoint
  BOOST_TEST(names_in(file).count("global_step") == 1u);
  const auto want = forward(t.s);

  // the forward graph alone: no minimize(), nothing declared before load_weights
  g::session<g::cpu_simd> inf;
  g::load_weights(inf, file, logits());
  BOOST_TEST(same_bits(forward(inf), want));
  BOOST_TEST(inf.entries().size() == 4u);  // the variables, no optimizer state
  BOOST_TEST(inf.global_step() == 0);      // the step counter is training's, not loaded

  // the session's own variables (declared by hand), without the model
  g::session<g::cpu_simd> decl;
  g::declare(decl, w1), g::declare(decl, b1), g::declare(decl, w2), g::declare(decl, b2);
  g::load_weights(decl, file);
  BOOST_TEST(same_bits(forward(decl), want));

  // training changed the outputs: not a trivially equal pair of untrained sessions
  g::session<g::cpu_simd> fresh;
  init(fresh);
  BOOST_TEST(!same_bits(forward(fresh), want));
}

BOOST_AUTO_TEST_CASE(save_weights_writes_the_variables_only) {
  temp_dir dir("weights");
  trained t(dir.p / "ckpt.npz");
  const fs::path file = dir.p / "weights.npz";
  g::save_weights(t.s, file);
  BOOST_TEST(t.s.entries().size() == 12u);  // 4 variables, 2 Adam tensors each
  const std::set<std::string> want{"dense1/b", "dense1/w", "dense2/b", "dense2/w"};
  BOOST_TEST((names_in(file) == want));
  const auto snap = snapshot(t.s);
  for (const auto& a : g::io::read_npz(file))
    BOOST_TEST_CONTEXT(a.name) { BOOST_TEST((a.bytes == snap.at(a.name))); }

  // and it loads like the checkpoint; into a training session, the optimizer state and
  // step counter stay as they were
  g::session<g::cpu_simd> s;
  auto st = g::minimize(s, loss(), g::adam{.lr = 0.05});
  s.set_global_step(2);
  const auto adam_before = snapshot(s).at("dense1/w/adam_m");
  g::load_weights(s, file);
  BOOST_TEST(same_bits(forward(s), forward(t.s)));
  BOOST_TEST((snapshot(s).at("dense1/w/adam_m") == adam_before));
  BOOST_TEST((snapshot(s).at("dense1/w/adam_m") != snap.at("dense1/w/adam_m")));
  BOOST_TEST(s.global_step() == 2);

  // .safetensors by the extension: the same tensors, read back by the safetensors reader,
  // and they load into an inference session like the .npz
  const fs::path st_file = dir.p / "weights.safetensors";
  g::save_weights(t.s, st_file);
  const auto tensors = g::io::read_safetensors(st_file);
  BOOST_TEST(tensors.size() == want.size());
  for (const auto& a : tensors)
    BOOST_TEST_CONTEXT(a.name) { BOOST_TEST((a.bytes == snap.at(a.name))); }
  g::session<g::cpu_simd> from_st;
  g::load_weights(from_st, st_file, logits());
  BOOST_TEST(same_bits(forward(from_st), forward(t.s)));

  g::session<g::cpu_simd> empty;
  BOOST_TEST(error_of([&] { g::save_weights(empty, dir.p / "none.npz"); }).find("holds no variables") !=
             std::string::npos);
  BOOST_TEST(!fs::exists(dir.p / "none.npz"));
  g::session<g::cpu_simd> unset;
  g::declare(unset, w1);
  BOOST_TEST(error_of([&] { g::save_weights(unset, dir.p / "unset.npz"); }).find("variable 'dense1/w' has no value yet") !=
             std::string::npos);
}

// Each refusal, by its message, into an initialised session (left bit for bit as it was)
// and into an empty one through the model (left empty: nothing declared).
BOOST_AUTO_TEST_CASE(refusals_name_the_tensor_and_load_nothing) {
  temp_dir dir("weights");
  const fs::path ckpt = dir.p / "ckpt.npz";
  trained t(ckpt);
  const fs::path bad = dir.p / "bad.npz";
  const auto refused = [&](auto&& change, const std::vector<std::string>& expect, g::weights_options o = {}) {
    edit(ckpt, bad, change);
    g::session<g::cpu_simd> s;
    init(s);
    const auto before = snapshot(s);
    const std::string msg = error_of([&] { g::load_weights(s, bad, o); });
    BOOST_TEST_MESSAGE(msg);
    BOOST_TEST(msg.find("load_weights '" + bad.string() + "'") != std::string::npos);
    BOOST_TEST(msg.find("nothing was loaded") != std::string::npos);
    for (const auto& e : expect) BOOST_TEST_CONTEXT(e) { BOOST_TEST(msg.find(e) != std::string::npos, msg); }
    BOOST_TEST((snapshot(s) == before));
    g::session<g::cpu_simd> empty;
    BOOST_TEST(error_of([&] { g::load_weights(empty, bad, logits(), o); }) == msg);
    BOOST_TEST(empty.entries().empty());
  };
  using arrays_t = std::vector<g::io::npz_array>;

  refused([](arrays_t& a) { std::erase_if(a, [](const auto& e) { return e.name == "dense2/b"; }); },
          {"missing from the file: 'dense2/b' (4,) float32", "written by another model"});

  // PyTorch's nn.Linear layout: dense1/w as [out, in]
  refused(
      [](arrays_t& a) {
        auto& w = array_named(a, "dense1/w");
        std::vector<std::byte> tr(w.bytes.size());
        for (std::size_t i = 0; i < 20; ++i)
          for (std::size_t j = 0; j < 16; ++j) std::memcpy(&tr[(j * 20 + i) * 4], &w.bytes[(i * 16 + j) * 4], 4);
        w.bytes = tr;
        w.shape = g::dims{16, 20};
      },
      {"'dense1/w': the session has (20, 16) float32, the file (16, 20) float32 (the transpose",
       "PyTorch, whose nn.Linear holds its weight [out, in]", "write weight.T"});

  refused(
      [](arrays_t& a) {
        auto& w = array_named(a, "dense2/w");
        w.bytes.resize(8 * 4 * 4);
        w.shape = g::dims{8, 4};
      },
      {"'dense2/w': the session has (16, 4) float32, the file (8, 4) float32"});

  refused(
      [](arrays_t& a) {
        auto& b = array_named(a, "dense2/b");
        std::vector<std::byte> d(4 * 8);
        for (std::size_t i = 0; i < 4; ++i) {
          float f;
          std::memcpy(&f, &b.bytes[i * 4], 4);
          const double v = f;
          std::memcpy(&d[i * 8], &v, 8);
        }
        b.bytes = d;
        b.dtype = g::element_type::f64;
      },
      {"'dense2/b': the session has (4,) float32, the file (4,) float64", ".astype(np.float32)"});

  refused(
      [](arrays_t& a) {
        auto& w = array_named(a, "dense1/w");
        const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
        std::memcpy(&w.bytes[(1 * 16 + 3) * 4], &nan, 4);
        std::memcpy(&w.bytes[(2 * 16 + 0) * 4], &inf, 4);
      },
      {"NaN or Inf", "'dense1/w' (20, 16) float32: element 19 [1, 3] is nan (2 of 320 elements are not finite)"});

  // an array that is no variable (a PyTorch state_dict's batch-norm counter) ...
  const auto add_counter = [](arrays_t& a) {
    const std::int64_t n = 7;
    g::io::npz_array c{"bn/num_batches_tracked", g::element_type::i64, g::dims{}, std::vector<std::byte>(8)};
    std::memcpy(c.bytes.data(), &n, 8);
    a.push_back(c);
  };
  refused(add_counter, {"not a variable of the session: 'bn/num_batches_tracked' () int64",
                        "{.extra = gradus::extra_arrays::ignore}"});
  // ... or optimizer state of another shape than its variable's is refused
  refused(
      [](arrays_t& a) {
        auto& m = array_named(a, "dense1/w/adam_m");
        m.bytes.resize(4 * 4);
        m.shape = g::dims{4};
      },
      {"not a variable of the session: 'dense1/w/adam_m' (4,) float32"});
  // ... and the extra array is skipped when asked
  {
    edit(ckpt, bad, add_counter);
    g::session<g::cpu_simd> s;
    g::load_weights(s, bad, logits(), {.extra = g::extra_arrays::ignore});
    BOOST_TEST(same_bits(forward(s), forward(t.s)));
  }
  // ... but the variables' checks are not: an extra array ignored, a missing one still refused
  refused(
      [&](arrays_t& a) {
        add_counter(a);
        std::erase_if(a, [](const auto& e) { return e.name == "dense1/b"; });
      },
      {"missing from the file: 'dense1/b' (16,) float32"}, {.extra = g::extra_arrays::ignore});
}

BOOST_AUTO_TEST_CASE(a_pipeline_stage_file_and_an_empty_session_are_refused) {
  temp_dir dir("weights");
  const fs::path stage = g::stage_checkpoint_file(dir.p / "ckpt.npz", 1, 2);
  trained t(stage, {.stages = 2, .stage = 1, .only = {"dense2/w", "dense2/b", "dense2/w/adam_m", "dense2/w/adam_v",
                                                       "dense2/b/adam_m", "dense2/b/adam_v"}});
  g::session<g::cpu_simd> s;
  const std::string msg = error_of([&] { g::load_weights(s, stage, logits()); });
  BOOST_TEST(msg.find("ckpt.stage-1-of-2.npz") != std::string::npos, msg);
  BOOST_TEST(msg.find("stage 1 of a 2-stage pipeline") != std::string::npos, msg);
  BOOST_TEST(msg.find("load each stage's file") != std::string::npos, msg);
  BOOST_TEST(s.entries().empty());

  // a session that holds no variables, given no model
  const std::string none = error_of([&] { g::load_weights(s, stage); });
  BOOST_TEST(none.find("holds no variables yet: pass the model") != std::string::npos, none);

  // a file that is not there names it
  BOOST_TEST(error_of([&] { g::load_weights(s, dir.p / "absent.npz", logits()); }).find("absent.npz") !=
             std::string::npos);
}

#define BOOST_TEST_MODULE io_checkpoint
// Checkpoints: save, restore into a fresh session, continue training — bit-identical to
// an uninterrupted run (variables, Adam state, the step counter and the schedule it
// drives); a mismatched checkpoint is refused with every difference listed and the
// session left untouched; failed saves leave the previous checkpoint intact; a negative
// step, NaN/Inf values and another world size are refused; temporaries of killed saves are
// removed by the next save, those of live writers never.
#include <algorithm>
#include <boost/test/unit_test.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/gradus.hpp>
#include <gradus/io/checkpoint.hpp>

#include "io_test_model.hpp"

namespace g = gradus;
namespace fs = std::filesystem;

namespace {

using namespace gradus::test;  // the model, init, snapshot, temp_dir, error_of

g::variable<"dense2/w", float, 16, 5> w2_wide;  // same name, other shape
g::variable<"extra", double, 3> extra;

auto optimizer() { return g::adam{.lr = g::cosine_lr(0.05, 40, 5, 0.001), .clip_global_norm = 2.0}; }

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

}  // namespace

BOOST_AUTO_TEST_CASE(resume_is_bit_identical) {
  temp_dir dir("ckpt");
  const batches data;
  // uninterrupted: 20 steps
  g::session<g::cpu_simd> a;
  init(a);
  auto sa = g::minimize(a, loss(), optimizer(), w1, b1, w2, b2);
  train(sa, data, 0, 20);

  // interrupted after 8 steps, saved, restored into a new session, 12 more
  const fs::path file = dir.p / "ckpt.npz";
  {
    g::session<g::cpu_simd> b;
    init(b);
    auto sb = g::minimize(b, loss(), optimizer(), w1, b1, w2, b2);
    train(sb, data, 0, 8);
    g::save_checkpoint(b, file);
  }
  g::session<g::cpu_simd> c;
  auto sc = g::minimize(c, loss(), optimizer(), w1, b1, w2, b2);  // declares, no values
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
  temp_dir dir("ckpt");
  const fs::path file = dir.p / "ckpt.npz";
  {
    g::session<g::cpu_simd> s;
    init(s);
    auto st = g::minimize(s, loss(), optimizer(), w1, b1, w2, b2);
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
  temp_dir dir("ckpt");
  const fs::path file = dir.p / "ckpt.npz";
  g::session<g::cpu_simd> s;
  init(s);
  g::save_checkpoint(s, file);
  std::ifstream in(file, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  BOOST_TEST(good.size() > 0u);

  g::session<g::cpu_simd> u;
  g::declare(u, w1);
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

namespace {

// A checkpoint of an Adam-trained session (4 variables, 8 optimizer arrays), step 3.
fs::path trained_checkpoint(const fs::path& dir, const g::checkpoint_options& o = {}) {
  const batches data;
  g::session<g::cpu_simd> s;
  init(s);
  auto st = g::minimize(s, loss(), optimizer(), w1, b1, w2, b2);
  train(st, data, 0, 3);
  const fs::path file = dir / "ckpt.npz";
  g::save_checkpoint(s, file, o);
  return file;
}

// The file's arrays after f(arrays), written back.
void edit(const fs::path& file, auto&& f) {
  auto arrays = g::io::read_npz(file);
  f(arrays);
  std::vector<g::io::npz_array_ref> refs;
  for (const auto& a : arrays) refs.push_back({a.name, a.dtype, a.shape, a.bytes.data()});
  g::io::write_npz(file, refs);
}

g::io::npz_array& array_named(std::vector<g::io::npz_array>& arrays, const std::string& name) {
  for (auto& a : arrays)
    if (a.name == name) return a;
  BOOST_FAIL("no array " << name);
  return arrays.front();
}

template <class T>
void set_element(g::io::npz_array& a, std::size_t i, T v) {
  BOOST_REQUIRE((i + 1) * sizeof(T) <= a.bytes.size());
  std::memcpy(a.bytes.data() + i * sizeof(T), &v, sizeof(T));
}

// A session ready for trained_checkpoint's file; its variables hold 7s so that a restore
// that wrote anything would show.
struct target {
  g::session<g::cpu_simd> s;
  decltype(g::minimize(s, loss(), optimizer(), w1, b1, w2, b2)) st =
      g::minimize(s, loss(), optimizer(), w1, b1, w2, b2);
  target() {
    g::initialize(s, w1, g::init::constant{7}, 1);
    g::initialize(s, b1, g::init::constant{7}, 1);
    g::initialize(s, w2, g::init::constant{7}, 1);
    g::initialize(s, b2, g::init::constant{7}, 1);
  }
};

bool has(const std::string& hay, const std::string& needle) {
  const bool found = hay.find(needle) != std::string::npos;
  if (!found) BOOST_TEST_MESSAGE("missing: " << needle << "\n in: " << hay);
  return found;
}

}  // namespace

BOOST_AUTO_TEST_CASE(world_size_is_recorded_and_a_mismatch_refused) {
  temp_dir dir("ckpt");
  const fs::path file = trained_checkpoint(dir.p, {.world_size = 4});
  // numpy sees an int64 scalar
  auto arrays = g::io::read_npz(file);
  const auto& w = array_named(arrays, "gradus/world_size");
  BOOST_TEST((w.dtype == g::element_type::i64));
  BOOST_TEST(w.shape.rank == 0u);
  std::int64_t v = 0;
  std::memcpy(&v, w.bytes.data(), sizeof v);
  BOOST_TEST(v == 4);

  {  // another world size: refused, nothing restored
    target t;
    const auto before = snapshot(t.s);
    const std::string msg = error_of([&] { g::restore_checkpoint(t.s, file, {.world_size = 2}); });
    BOOST_TEST(has(msg, "ckpt.npz"));
    BOOST_TEST(has(msg, "written by a job of 4 ranks; this job has 2: the global step counts steps of 4 x batch "
                        "examples"));
    BOOST_TEST(has(msg, "nothing was restored"));
    BOOST_TEST((snapshot(t.s) == before));
    BOOST_TEST(t.s.global_step() == 0);
  }
  for (const int world : {4, 0}) {  // the same world size, or none expected: accepted
    BOOST_TEST_CONTEXT("world_size " << world) {
      target t;
      g::restore_checkpoint(t.s, file, {.world_size = world});
      BOOST_TEST(t.s.global_step() == 3);
      BOOST_TEST(snapshot(t.s).at("dense1/w") != snapshot(target{}.s).at("dense1/w"));
    }
  }
  {  // the old API: no world size
    target t;
    g::restore_checkpoint(t.s, file);
    BOOST_TEST(t.s.global_step() == 3);
  }
  // A file without the field (older gradus, or saved without it) restores under any world size.
  const fs::path old = trained_checkpoint(dir.p);
  arrays = g::io::read_npz(old);
  for (const auto& a : arrays) BOOST_TEST(a.name != "gradus/world_size");
  target t;
  g::restore_checkpoint(t.s, old, {.world_size = 2});
  BOOST_TEST(t.s.global_step() == 3);
  // a recorded world size below 1 is a corrupt file
  edit(old, [](auto& as) {
    const std::int64_t zero = 0;
    g::io::npz_array a{"gradus/world_size", g::element_type::i64, g::dims{}, std::vector<std::byte>(8)};
    std::memcpy(a.bytes.data(), &zero, 8);
    as.push_back(a);
  });
  target u;
  BOOST_TEST(has(error_of([&] { g::restore_checkpoint(u.s, old); }), "'gradus/world_size' is 0"));
  BOOST_TEST(u.s.global_step() == 0);
  BOOST_TEST(has(error_of([&] { g::save_checkpoint(u.s, old, {.world_size = -1}); }), "world_size -1 is negative"));
}

// A pipeline stage's file (parallel/pipeline/checkpoint.hpp writes one per stage): only the
// tensors named, and the stage layout; the wrong stage, stage count or kind of file refused.
BOOST_AUTO_TEST_CASE(a_stage_file_holds_its_tensors_and_its_place) {
  temp_dir dir("ckpt");
  const std::vector<std::string> mine{"dense1/w", "dense1/b"};
  const fs::path file = trained_checkpoint(dir.p, {.world_size = 2, .stages = 2, .stage = 1, .only = mine});
  std::vector<std::string> names;
  for (const auto& a : g::io::read_npz(file)) names.push_back(a.name);
  std::sort(names.begin(), names.end());
  const std::vector<std::string> want{"dense1/b",      "dense1/w",      "global_step",      "gradus/precision",
                                     "gradus/stage", "gradus/stages", "gradus/world_size"};
  BOOST_TEST(names == want, names.size() << " arrays");
  BOOST_TEST(g::stage_checkpoint_file(dir.p / "run" / "ckpt.npz", 1, 2) == dir.p / "run" / "ckpt.stage-1-of-2.npz");
  {
    target t;
    const auto before = snapshot(t.s);
    g::restore_checkpoint(t.s, file, {.world_size = 2, .stages = 2, .stage = 1, .only = mine});
    BOOST_TEST(t.s.global_step() == 3);
    const auto after = snapshot(t.s);
    BOOST_TEST(after.at("dense1/w") != before.at("dense1/w"));
    BOOST_TEST(after.at("dense2/w") == before.at("dense2/w"));  // not in the file: untouched
  }
  target t;
  const auto before = snapshot(t.s);
  BOOST_TEST(has(error_of([&] { g::restore_checkpoint(t.s, file, {.world_size = 2, .stages = 3, .stage = 1, .only = mine}); }),
                 "written by a pipeline of 2 stages; this job runs 3: resume with --stages 2"));
  BOOST_TEST(has(error_of([&] { g::restore_checkpoint(t.s, file, {.world_size = 2, .stages = 2, .stage = 0, .only = mine}); }),
                 "holds stage 1 of the pipeline, and this rank runs stage 0"));
  BOOST_TEST(has(error_of([&] { g::restore_checkpoint(t.s, file); }), "the file holds one stage of a 2-stage pipeline"));
  fs::create_directories(dir.p / "whole");
  const fs::path whole = trained_checkpoint(dir.p / "whole");
  BOOST_TEST(has(error_of([&] { g::restore_checkpoint(t.s, whole, {.stages = 2, .stage = 0, .only = mine}); }),
                 "the file holds a whole model, not stage 0 of a 2-stage pipeline"));
  BOOST_TEST(has(error_of([&] { g::restore_checkpoint(t.s, file, {.only = {"nope"}}); }), "the session holds no tensor named 'nope'"));
  BOOST_TEST((snapshot(t.s) == before));
  BOOST_TEST(t.s.global_step() == 0);
  // what a run given the whole-model path finds of pipelined checkpoints
  fs::copy_file(file, g::stage_checkpoint_file(dir.p / "ckpt2.npz", 0, 2));
  fs::copy_file(file, g::stage_checkpoint_file(dir.p / "ckpt2.npz", 0, 12));
  fs::copy_file(file, dir.p / "ckpt2.stage-0-of-x.npz");
  BOOST_TEST((g::stage_checkpoints_present(dir.p / "ckpt2.npz") == std::vector<int>{2, 12}));
  BOOST_TEST(g::stage_checkpoints_present(dir.p / "none.npz").empty());
}

// The commit record of a checkpoint in several files (io/checkpoint_set.hpp): the names, the
// text written and read back, every malformed line refused with its reason, and the parts of
// other saves removed after a commit while the committed ones and other layouts stay.
BOOST_AUTO_TEST_CASE(a_commit_record_names_one_complete_set) {
  temp_dir dir("ckpt");
  const fs::path file = dir.p / "run" / "ckpt.npz";
  fs::create_directories(file.parent_path());
  BOOST_TEST(g::checkpoint_commit_file(file) == dir.p / "run" / "ckpt.commit");
  BOOST_TEST(g::checkpoint_part_file(file, "stage", 1, 2, 7) == dir.p / "run" / "ckpt-7.stage-1-of-2.npz");
  const g::checkpoint_commit c{7, 188, "stage", 2, {1912345, 23456}};
  const std::string text = g::format_checkpoint_commit(c, file);
  BOOST_TEST(text == "gradus-checkpoint-commit 1\nsave 7\nglobal_step 188\nkind stage\nparts 2\n"
                     "part 0 ckpt-7.stage-0-of-2.npz 1912345\npart 1 ckpt-7.stage-1-of-2.npz 23456\n");
  BOOST_TEST(!g::read_checkpoint_commit(file).has_value());
  g::write_checkpoint_commit(file, c);
  const auto back = g::read_checkpoint_commit(file);
  BOOST_TEST_REQUIRE(back.has_value());
  BOOST_TEST((back->save == 7 && back->global_step == 188 && back->kind == "stage" && back->parts == 2));
  BOOST_TEST((back->bytes == std::vector<std::uint64_t>{1912345, 23456}));
  BOOST_TEST(g::committed_stage_file(file, 1) == dir.p / "run" / "ckpt-7.stage-1-of-2.npz");
  BOOST_TEST((g::stage_checkpoints_present(file) == std::vector<int>{2}));
  const std::vector<std::pair<std::string, std::string>> bad{
      {"", "its first line is not 'gradus-checkpoint-commit 1'"},
      {"gradus-checkpoint-commit 2\n", "its first line is not"},
      {"gradus-checkpoint-commit 1\nsave 7", "its last line is not ended"},
      {"gradus-checkpoint-commit 1\nsave -1\n", "line 2 is not 'save N' (N >= 1)"},
      {"gradus-checkpoint-commit 1\nsave 7\nglobal_step x\n", "line 3 is not 'global_step N'"},
      {"gradus-checkpoint-commit 1\nsave 7\nglobal_step 1\nkind ../x\n", "line 4 is not 'kind NAME'"},
      {"gradus-checkpoint-commit 1\nsave 7\nglobal_step 1\nkind stage\nparts 0\n", "line 5 is not 'parts N'"},
      {"gradus-checkpoint-commit 1\nsave 7\nglobal_step 1\nkind stage\nparts 2\npart 0 ckpt-7.stage-0-of-2.npz 5\n",
       "it lists 1 parts for 'parts 2'"},
      {"gradus-checkpoint-commit 1\nsave 7\nglobal_step 1\nkind stage\nparts 1\npart 0 ckpt-6.stage-0-of-1.npz 5\n",
       "line 6 is not 'part 0 ckpt-7.stage-0-of-1.npz BYTES'"}};
  for (const auto& [t, why] : bad) {
    std::ofstream(g::checkpoint_commit_file(file), std::ios::trunc) << t;
    const std::string e = error_of([&] { g::read_checkpoint_commit(file); });
    BOOST_TEST(has(e, "commit record '" + g::checkpoint_commit_file(file).string() + "': malformed: " + why), e);
  }
  BOOST_TEST(has(error_of([&] { g::committed_stage_file(dir.p / "none.npz", 0); }), "no commit record of a pipeline's stages"));
  // after a commit of save 3: stage 1's other saves go, with the superseded 0.1 file; stage
  // 0's files and another stage count's stay (another rank's, another layout's)
  for (const int n : {1, 2, 3}) std::ofstream(g::checkpoint_part_file(file, "stage", 1, 2, n)) << n;
  std::ofstream(g::checkpoint_part_file(file, "stage", 0, 2, 2)) << 0;
  std::ofstream(g::checkpoint_part_file(file, "stage", 1, 3, 2)) << 0;
  std::ofstream(g::stage_checkpoint_file(file, 1, 2)) << 0;
  BOOST_TEST((g::checkpoint_parts_present(file, "stage", 1, 2).size() == 3u));
  g::remove_other_parts(file, "stage", 1, 2, 3, {g::stage_checkpoint_file(file, 1, 2)});
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(file.parent_path())) left.insert(e.path().filename().string());
  BOOST_TEST((left == std::set<std::string>{"ckpt-2.stage-0-of-2.npz", "ckpt-2.stage-1-of-3.npz", "ckpt-3.stage-1-of-2.npz",
                                            "ckpt.commit"}));
}

BOOST_AUTO_TEST_CASE(a_negative_global_step_is_refused) {
  temp_dir dir("ckpt");
  const fs::path file = trained_checkpoint(dir.p);
  edit(file, [](auto& as) { set_element<std::int64_t>(array_named(as, "global_step"), 0, -3); });
  target t;
  const auto before = snapshot(t.s);
  const std::string msg = error_of([&] { g::restore_checkpoint(t.s, file); });
  BOOST_TEST(has(msg, "ckpt.npz"));
  BOOST_TEST(has(msg, "'global_step' is -3"));
  BOOST_TEST((snapshot(t.s) == before));
  BOOST_TEST(t.s.global_step() == 0);
  // step 0 is a step counter like any other
  edit(file, [](auto& as) { set_element<std::int64_t>(array_named(as, "global_step"), 0, 0); });
  g::restore_checkpoint(t.s, file);
  BOOST_TEST(t.s.global_step() == 0);
  BOOST_TEST((snapshot(t.s) != before));
}

BOOST_AUTO_TEST_CASE(nan_and_inf_are_refused_naming_array_and_element) {
  temp_dir dir("ckpt");
  const fs::path file = trained_checkpoint(dir.p);
  edit(file, [](auto& as) {
    auto& w = array_named(as, "dense1/w");  // (20, 16)
    set_element(w, 37, std::nanf(""));
    set_element(w, 300, std::numeric_limits<float>::infinity());
    set_element(array_named(as, "dense2/b/adam_v"), 2, -std::numeric_limits<float>::infinity());
  });
  target t;
  const auto before = snapshot(t.s);
  const std::string msg = error_of([&] { g::restore_checkpoint(t.s, file); });
  BOOST_TEST(has(msg, "ckpt.npz"));
  BOOST_TEST(has(msg, "NaN or Inf"));
  BOOST_TEST(has(msg, "'dense1/w' (20, 16) float32: element 37 [2, 5] is nan (2 of 320 elements are not finite)"));
  BOOST_TEST(has(msg, "'dense2/b/adam_v' (4,) float32: element 2 is -inf (1 of 4 elements are not finite)"));
  BOOST_TEST(!has(msg, "'dense1/b'"));
  BOOST_TEST((snapshot(t.s) == before));
  BOOST_TEST(t.s.global_step() == 0);
  // the same file with finite values (large, tiny, negative zero) restores
  edit(file, [](auto& as) {
    auto& w = array_named(as, "dense1/w");
    set_element(w, 37, std::numeric_limits<float>::max());
    set_element(w, 300, -0.0f);
    set_element(array_named(as, "dense2/b/adam_v"), 2, std::numeric_limits<float>::denorm_min());
  });
  g::restore_checkpoint(t.s, file);
  BOOST_TEST(t.s.global_step() == 3);
}

namespace {

// A pid that is certainly not alive: a child's, after it exited and was reaped.
pid_t dead_pid() {
  const pid_t p = ::fork();
  BOOST_REQUIRE(p >= 0);
  if (p == 0) ::_exit(0);
  int st = 0;
  BOOST_REQUIRE(::waitpid(p, &st, 0) == p);
  return p;
}

// A live child that sleeps (at most 60 s), ended by pid when this goes out of scope.
struct live_child {
  pid_t pid = ::fork();
  live_child() {
    BOOST_REQUIRE(pid >= 0);
    if (pid == 0) {
      ::sleep(60);
      ::_exit(0);
    }
  }
  ~live_child() {
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
};

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> r;
  for (const auto& f : fs::directory_iterator(dir)) r.insert(f.path().filename().string());
  return r;
}

void touch(const fs::path& p) { std::ofstream(p) << "partial checkpoint"; }

}  // namespace

BOOST_AUTO_TEST_CASE(stale_temporaries_of_the_file_are_removed_live_ones_kept) {
  temp_dir dir("ckpt");
  const std::string host = g::io::detail::host_tag();
  const pid_t dead = dead_pid(), self = ::getpid();
  live_child live;
  const auto tmp = [&](const std::string& file, pid_t pid, int n, const std::string& h) {
    return file + ".tmp." + std::to_string(pid) + "." + std::to_string(n) + "." + h;
  };
  const std::set<std::string> stale = {
      tmp("ckpt.npz", dead, 0, host),              // a killed writer's
      tmp("ckpt.npz", dead, 1, host) + ".a1B2c3",  // libzip's own temporary inside it
      tmp("ckpt.npz", self, 99999, host),          // our pid, not being written: a former pid 1
  };
  const std::set<std::string> kept = {
      tmp("ckpt.npz", live.pid, 0, host),              // a live writer's
      tmp("ckpt.npz", live.pid, 0, host) + ".XyZ123",  // and libzip's
      tmp("ckpt.npz", dead, 2, host + "x"),            // another host's: its pid means nothing here
      tmp("other.npz", dead, 0, host),                 // another checkpoint's
      tmp("ckpt.npz.1", dead, 0, host),
      "ckpt.npz.tmp.notes",
      "ckpt.npz.tmp." + std::to_string(dead) + ".0",  // not our pattern
      tmp("ckpt.npz", dead, 0, host) + ".with-dash",
      "ckpt.npz.bak",
  };
  for (const auto& n : stale) touch(dir.p / n);
  for (const auto& n : kept) touch(dir.p / n);

  g::session<g::cpu_simd> s;
  init(s);
  g::save_checkpoint(s, dir.p / "ckpt.npz");
  std::set<std::string> want = kept;
  want.insert("ckpt.npz");
  BOOST_TEST(names_in(dir.p) == want, boost::test_tools::per_element());
  // once the live writer is gone, its temporaries go with the next save
  ::kill(live.pid, SIGKILL);
  int st = 0;
  BOOST_REQUIRE(::waitpid(live.pid, &st, 0) == live.pid);
  g::save_checkpoint(s, dir.p / "ckpt.npz");
  want.erase(tmp("ckpt.npz", live.pid, 0, host));
  want.erase(tmp("ckpt.npz", live.pid, 0, host) + ".XyZ123");
  BOOST_TEST(names_in(dir.p) == want, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_save_killed_midway_leaves_nothing_after_the_next_save) {
  temp_dir dir("ckpt");
  const fs::path file = dir.p / "big.npz";
  const std::string prefix = "big.npz.tmp.";
  const auto temporaries = [&] {
    std::vector<std::string> r;
    for (const auto& n : names_in(dir.p))
      if (n.starts_with(prefix)) r.push_back(n);
    return r;
  };
  std::vector<float> big(std::size_t{12} << 20, 0.5f);  // 48 MB
  const g::io::npz_array_ref array{"big", "float32", g::dims{static_cast<g::index_t>(big.size())}, big.data()};
  std::vector<std::string> left;
  for (int attempt = 0; attempt < 5 && left.empty(); ++attempt) {
    const pid_t child = ::fork();
    BOOST_REQUIRE(child >= 0);
    if (child == 0) {  // saves in a loop until killed (or 200 saves)
      try {
        for (int i = 0; i < 200; ++i) g::io::write_npz(file, {array});
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    // Kill it while a temporary of its own is on disk (wait at most 20 s for one).
    const std::string mine = prefix + std::to_string(child) + ".";
    const auto t0 = std::chrono::steady_clock::now();
    bool seen = false;
    while (!seen && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
      for (const auto& n : temporaries()) seen = seen || n.starts_with(mine);
      if (!seen) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ::kill(child, SIGKILL);
    int st = 0;
    BOOST_REQUIRE(::waitpid(child, &st, 0) == child);
    BOOST_TEST_REQUIRE(seen, "the saving child never showed a temporary");
    BOOST_TEST(WIFSIGNALED(st));
    left = temporaries();  // empty when the kill landed between rename and the next save
  }
  BOOST_TEST_MESSAGE("left by the killed save: " << (left.empty() ? "-" : left.front()));
  BOOST_TEST_REQUIRE(!left.empty());
  // The next save, of anything, to the same file removes them.
  g::session<g::cpu_simd> s;
  init(s);
  g::save_checkpoint(s, file);
  BOOST_TEST(temporaries().empty());
  g::session<g::cpu_simd> r;
  init(r);
  g::restore_checkpoint(r, file);
}

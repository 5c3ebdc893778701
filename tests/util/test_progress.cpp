#define BOOST_TEST_MODULE util_progress
// The progress bar: plain lines when not on a terminal (no carriage return; one every
// `every` steps, one per epoch, with the mean loss, samples/s and ETA computed from a fake
// clock), and the live line's redraws limited to one per refresh interval.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include <gradus/util/progress.hpp>

namespace gu = gradus::util;

namespace {
double fake_now = 0;
double fake_clock() { return fake_now; }
std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> v;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(plain_lines_when_not_a_terminal) {
  std::ostringstream out;
  BOOST_TEST(!gu::is_terminal(out));
  fake_now = 100;
  gu::progress bar(out, false, {.every = 2, .refresh_s = 0.1, .width = 30, .clock = &fake_clock});
  bar.start_epoch(1, 2, 5);
  for (int i = 1; i <= 5; ++i) {  // 0.5 s and 64 samples a step, losses 1..5
    fake_now += 0.5;
    bar.step(i, 64);
  }
  bar.end_epoch({{"test_accuracy", 0.9}});
  BOOST_TEST(bar.mean_loss() == 3.0);
  BOOST_TEST(bar.epoch_seconds() == 2.5);
  const std::string s = out.str();
  BOOST_TEST(s.find('\r') == std::string::npos);
  const auto lines = lines_of(s);
  BOOST_REQUIRE(lines.size() == 3u);
  // after step 2: mean loss 1.5, 128 samples in 1 s, 3 steps left at 0.5 s each
  BOOST_TEST(lines[0] == "epoch 1/2 step 2/5 loss 1.5000 samples/s 128 eta_s 1.5");
  BOOST_TEST(lines[1] == "epoch 1/2 step 4/5 loss 2.5000 samples/s 128 eta_s 0.5");
  BOOST_TEST(lines[2] == "epoch 1/2 step 5/5 loss 3.0000 samples/s 128 seconds 2.5 test_accuracy 0.9000");

  // every = 0: the epoch's line only
  std::ostringstream quiet;
  gu::progress per_epoch(quiet, false, {.every = 0, .refresh_s = 0.1, .width = 30, .clock = &fake_clock});
  per_epoch.start_epoch(2, 2, 3);
  for (int i = 0; i < 3; ++i) per_epoch.step(0.25, 10);
  fake_now += 1;
  per_epoch.stop();  // the evaluation after stop() does not count
  fake_now += 5;
  per_epoch.end_epoch();
  BOOST_TEST(quiet.str() == "epoch 2/2 step 3/3 loss 0.2500 samples/s 30 seconds 1.0\n");
  BOOST_TEST(per_epoch.epoch_seconds() == 1.0);
}

BOOST_AUTO_TEST_CASE(live_line_redrawn_at_most_every_refresh_interval) {
  std::ostringstream out;
  fake_now = 0;
  gu::progress bar(out, true, {.every = 0, .refresh_s = 0.1, .width = 10, .clock = &fake_clock});
  bar.start_epoch(1, 1, 1000);
  for (int i = 0; i < 1000; ++i) {  // 1000 steps in 1 s: about 10 redraws, not 1000
    fake_now += 0.001;
    bar.step(0.5, 32);
  }
  fake_now = 1.0;
  bar.end_epoch({{"test_accuracy", 0.5}});
  const std::string s = out.str();
  const auto redraws = std::count(s.begin(), s.end(), '\r');
  BOOST_TEST(redraws >= 9);
  BOOST_TEST(redraws <= 12);
  BOOST_TEST(std::count(s.begin(), s.end(), '\n') == 1);  // one finished line per epoch
  const std::string last = s.substr(s.rfind('\r') + 1);
  BOOST_TEST(last.rfind("epoch 1/1  1000/1000 [==========] - 1s - loss 0.5000 - 32000 samples/s - test_accuracy 0.5000", 0) == 0u,
             last);
  // a line in progress shows the ETA
  BOOST_TEST(s.find("ETA ") != std::string::npos);
}

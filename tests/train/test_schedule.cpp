#define BOOST_TEST_MODULE train_schedule
// Learning-rate schedules: values at chosen steps against the formulas, and the errors
// their invalid arguments raise.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <numbers>
#include <string>

#include <gradus/gradus.hpp>

namespace g = gradus;
namespace tt = boost::test_tools;

BOOST_AUTO_TEST_CASE(schedules) {
  BOOST_TEST(g::constant_lr(0.1)(0) == 0.1);
  BOOST_TEST(g::constant_lr(0.1)(100000) == 0.1);
  const auto st = g::step_lr(0.1, 10, 0.5);
  BOOST_TEST(st(9) == 0.1);
  BOOST_TEST(st(10) == 0.05);
  BOOST_TEST(st(25) == 0.025);
  const auto ex = g::exponential_lr(0.1, 0.5, 10);
  BOOST_TEST(ex(5) == 0.1 * std::pow(0.5, 0.5), tt::tolerance(1e-14));
  BOOST_TEST(ex(20) == 0.025, tt::tolerance(1e-14));
  BOOST_TEST(g::exponential_lr(0.1, 0.5, 10, true)(15) == 0.05);
  const auto cs = g::cosine_lr(1.0, 110, 10, 0.1);
  BOOST_TEST(cs(0) == 1.0 / 11, tt::tolerance(1e-14));    // warm-up, linear
  BOOST_TEST(cs(9) == 10.0 / 11, tt::tolerance(1e-14));
  BOOST_TEST(cs(10) == 1.0, tt::tolerance(1e-14));        // peak
  BOOST_TEST(cs(60) == 0.55, tt::tolerance(1e-14));       // halfway: (1 + 0.1) / 2
  BOOST_TEST(cs(110) == 0.1, tt::tolerance(1e-14));       // the floor, and after it
  BOOST_TEST(cs(500) == 0.1, tt::tolerance(1e-14));
  BOOST_TEST(cs(35) == 0.1 + 0.45 * (1 + std::cos(std::numbers::pi * 0.25)), tt::tolerance(1e-14));
  auto msg = [](auto&& f) {
    try {
      f();
    } catch (const g::error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  BOOST_TEST(msg([] { g::step_lr(0.1, 0, 0.5); }).find("step_lr: step_size must be positive, got 0") != std::string::npos);
  BOOST_TEST(msg([] { g::cosine_lr(0.1, 10, 10); }).find("cosine_lr: need 0 <= warmup_steps < total_steps") !=
             std::string::npos);
  BOOST_TEST(msg([] { g::constant_lr(std::nan("")); }).find("learning rate must be a finite number") != std::string::npos);
  // factors that would make a rate negative or infinite
  BOOST_TEST(msg([] { g::step_lr(0.1, 10, -0.5); }) == "gradus: step_lr: gamma must be a finite number >= 0, got -0.5");
  BOOST_TEST(msg([] { g::step_lr(0.1, 10, INFINITY); }) == "gradus: step_lr: gamma must be a finite number >= 0, got inf");
  BOOST_TEST(msg([] { g::exponential_lr(0.1, INFINITY, 10); }) ==
             "gradus: exponential_lr: decay_rate must be a finite number > 0, got inf");
  BOOST_TEST(msg([] { g::exponential_lr(0.1, 0, 10); }) == "gradus: exponential_lr: decay_rate must be a finite number > 0, got 0");
  BOOST_TEST(msg([] { g::cosine_lr(0.1, 10, 0, -0.01); }) == "gradus: cosine_lr: min_lr must be a finite number >= 0, got -0.01");
  BOOST_TEST(msg([] { g::step_lr(0.1, 10, 0); }) == "no error");  // the rate falls to 0 after 10 steps
}

#define BOOST_TEST_MODULE util_svg_plot
// The SVG plot of training curves: well-formed (every tag closed, properly nested), one
// polyline per series with one point per epoch, a point's coordinates computed by hand,
// ticks, axis labels and the legend present.
#include <boost/test/unit_test.hpp>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <gradus/util/svg_plot.hpp>

namespace gu = gradus::util;

namespace {
gu::metrics_table three_epochs() {
  gu::metrics_table m;
  m.columns = {"epoch", "train_loss", "test_accuracy"};
  m.rows = {{1, 0.5, 0.9}, {2, 0.3, 0.95}, {3, 0.2, 0.97}};
  return m;
}
// Tags open and close in nested order; returns "" when fine, else what went wrong.
std::string check_balanced(const std::string& svg) {
  const std::regex tag(R"(<(/?)([A-Za-z][A-Za-z0-9]*)\b[^>]*?(/?)>)");
  std::vector<std::string> stack;
  int tags = 0;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it) {
    ++tags;
    const auto& m = *it;
    if (m[3].length()) continue;  // <x/>
    if (m[1].length()) {
      if (stack.empty() || stack.back() != m[2]) return "unexpected </" + m[2].str() + ">";
      stack.pop_back();
    } else {
      stack.push_back(m[2]);
    }
  }
  if (!stack.empty()) return "unclosed <" + stack.back() + ">";
  return tags > 0 ? "" : "no tags";
}
std::vector<std::string> polyline_points(const std::string& svg) {
  const std::regex poly(R"(<polyline[^>]*points="([^"]*)\")");
  std::vector<std::string> v;
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), poly); it != std::sregex_iterator(); ++it)
    v.push_back((*it)[1]);
  return v;
}
}  // namespace

BOOST_AUTO_TEST_CASE(well_formed_one_point_per_epoch) {
  const std::string svg = gu::svg_plot(gu::training_curves(three_epochs()));
  BOOST_TEST(check_balanced(svg) == "");
  BOOST_TEST(svg.rfind("<?xml", 0) == 0u);
  const auto polys = polyline_points(svg);
  BOOST_REQUIRE(polys.size() == 2u);  // train_loss, test_accuracy
  for (const auto& p : polys) {
    std::istringstream in(p);
    int points = 0;
    for (std::string pt; in >> pt;) ++points;
    BOOST_TEST(points == 3);
  }
  // Loss panel (the first): plot area x 64..464, y 36..288 (480x340 less the margins).
  // x: epochs 1..3, step 1 (integer) -> axis 1..3; y: 0.2..0.5, raw step 0.06 -> 0.1,
  // axis 0.2..0.5. Epoch 2, loss 0.3: x = 64 + (2-1)/2*400 = 264, y = 36 + (0.5-0.3)/0.3*252 = 204.
  BOOST_TEST(polys[0] == "64.00,36.00 264.00,204.00 464.00,288.00");
  // Accuracy panel starts at 480: y 0.9..0.97, raw step 0.014 -> 0.02, axis 0.90..0.98;
  // epoch 3, 0.97: x = 544 + 400 = 944, y = 36 + (0.98-0.97)/0.08*252 = 67.5.
  BOOST_TEST(polys[1].substr(polys[1].rfind(' ') + 1) == "944.00,67.50");
  // axes: tick labels, axis titles, legend entries
  for (const char* part : {">0.2</text>", ">0.5</text>", ">0.98</text>", ">epoch</text>", ">train_loss</text>",
                           ">test_accuracy</text>", ">loss</text>", ">accuracy</text>"})
    BOOST_TEST(svg.find(part) != std::string::npos, part);
}

namespace {
// the y of the legend text naming `name`
double legend_y(const std::string& svg, const std::string& name) {
  const std::regex text("<text x=\"[0-9.]+\" y=\"([0-9.]+)\">" + name + "</text>");
  std::smatch m;
  BOOST_REQUIRE(std::regex_search(svg, m, text));
  return std::stod(m[1]);
}
}  // namespace

BOOST_AUTO_TEST_CASE(legend_avoids_the_curves) {
  // plot area y 36..288: a falling curve leaves the top right free, a rising one does not
  gu::plot_panel fall{"f", "x", "y", {{"falling", {0, 1}, {1, 0}}}, false};
  gu::plot_panel rise{"r", "x", "y", {{"rising", {0, 1}, {0, 1}}}, false};
  BOOST_TEST(legend_y(gu::svg_plot({fall}), "falling") == 36 + 2 + 16);       // top right
  BOOST_TEST(legend_y(gu::svg_plot({rise}), "rising") == 288 - 24 - 2 + 16);  // bottom right
}

BOOST_AUTO_TEST_CASE(nice_axis_and_escaping) {
  const auto a = gu::nice_axis::of(0.013, 0.087, false);  // raw step 0.0148 -> 0.02
  BOOST_TEST(a.step == 0.02, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(a.lo == 0.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(a.hi == 0.1, boost::test_tools::tolerance(1e-12));
  const auto one = gu::nice_axis::of(2, 2, true);  // a single epoch
  BOOST_TEST(one.lo < 2.0);
  BOOST_TEST(one.hi > 2.0);
  gu::plot_panel p{"a<b & c", "x", "y", {{"s\"1", {1}, {1}}}, false};
  const std::string svg = gu::svg_plot({p});
  BOOST_TEST(check_balanced(svg) == "");
  BOOST_TEST(svg.find("a&lt;b &amp; c") != std::string::npos);
  BOOST_TEST(svg.find("data-name=\"s&quot;1\"") != std::string::npos);
}

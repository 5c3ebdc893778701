// tensor_view, what session::run returns: element (i, j, ...) with its index checks, the
// shape as a range, the view of T as a view of const T, and numpy's printing (the expected
// strings are numpy 1.24's str() of the same arrays, where the formats agree: integers, and
// the elision and line layout of large arrays).
#define BOOST_TEST_MODULE core_tensor_view
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <iomanip>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include <gradus/core/tensor_view.hpp>

namespace g = gradus;

namespace {

template <class T>
std::string str(const g::tensor_view<T>& v, int precision = 6) {
  std::ostringstream o;
  o << std::setprecision(precision) << v;
  return o.str();
}

std::string error_of(const auto& f) {
  try {
    f();
  } catch (const g::error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

BOOST_AUTO_TEST_CASE(elements_by_index_and_the_shape_as_a_range) {
  std::vector<float> a(24);
  std::iota(a.begin(), a.end(), 0.f);
  const g::tensor_view<float> v(a.data(), g::dims{2, 3, 4});
  BOOST_TEST(v(0, 0, 0) == 0.f);
  BOOST_TEST(v(1, 2, 3) == 23.f);
  BOOST_TEST(v(1, 0, 2) == 14.f);  // 1*12 + 0*4 + 2
  BOOST_TEST(v[14] == 14.f);
  v(0, 1, 1) = -5.f;  // a view of non-const elements writes through
  BOOST_TEST(a[5] == -5.f);
  BOOST_TEST(v.rank() == 3u);
  BOOST_TEST(v.size() == 24);
  BOOST_TEST(v.shape().size() == 3u);
  BOOST_TEST(v.shape()[2] == 4);
  const std::vector<g::index_t> extents(v.shape().begin(), v.shape().end());
  BOOST_TEST(extents == (std::vector<g::index_t>{2, 3, 4}), boost::test_tools::per_element());
  const g::tensor_view<const float> c = v;  // a view of T is a view of const T
  BOOST_TEST(c.data() == a.data());
  BOOST_TEST(c(1, 2, 3) == 23.f);
  BOOST_TEST((c.shape() == g::dims{2, 3, 4}));
}

BOOST_AUTO_TEST_CASE(an_index_out_of_range_or_of_the_wrong_count_is_refused_naming_it) {
  std::vector<int> a(6);
  const g::tensor_view<const int> v(a.data(), g::dims{2, 3});
  BOOST_TEST(error_of([&] { (void)v(2, 0); }) ==
             "gradus: tensor_view(2, 0): index 2 of dimension 0 is out of range for shape (2, 3) (0 to 1)");
  BOOST_TEST(error_of([&] { (void)v(1, -1); }) ==
             "gradus: tensor_view(1, -1): index -1 of dimension 1 is out of range for shape (2, 3) (0 to 2)");
  BOOST_TEST(error_of([&] { (void)v(1); }) ==
             "gradus: tensor_view(1): 1 indices for a tensor of shape (2, 3) (rank 2); give one index per dimension, "
             "or [k] for flat index k");
  BOOST_TEST(error_of([&] { (void)v(1, 2); }) == "(no error)");
  float s = 7.f;
  const g::tensor_view<float> scalar(&s, g::dims{});
  BOOST_TEST(scalar() == 7.f);  // rank 0: no index
}

BOOST_AUTO_TEST_CASE(printing_follows_numpy) {
  std::vector<std::int32_t> a(8);
  std::iota(a.begin(), a.end(), 0);
  BOOST_TEST(str(g::tensor_view<const std::int32_t>(a.data(), g::dims{2, 3})) == "[[0 1 2]\n [3 4 5]]");
  BOOST_TEST(str(g::tensor_view<const std::int32_t>(a.data(), g::dims{2, 2, 2})) ==
             "[[[0 1]\n  [2 3]]\n\n [[4 5]\n  [6 7]]]");
  BOOST_TEST(str(g::tensor_view<const std::int32_t>(a.data(), g::dims{8})) == "[0 1 2 3 4 5 6 7]");
  // right-aligned to the widest element, negatives included
  const std::vector<std::int64_t> b{-12, 3, 100, 7};
  BOOST_TEST(str(g::tensor_view<const std::int64_t>(b.data(), g::dims{2, 2})) == "[[-12   3]\n [100   7]]");
  // bytes print as numbers, not characters
  const std::vector<std::uint8_t> u{255, 7};
  BOOST_TEST(str(g::tensor_view<const std::uint8_t>(u.data(), g::dims{2})) == "[255   7]");
  // a scalar prints bare; an empty array as []
  const double d = 2.5;
  BOOST_TEST(str(g::tensor_view<const double>(&d, g::dims{})) == "2.5");
  BOOST_TEST(str(g::tensor_view<const std::int32_t>(a.data(), g::dims{0, 3})) == "[]");
}

BOOST_AUTO_TEST_CASE(floating_point_prints_at_the_streams_precision) {
  const std::vector<float> f{1.f / 3.f, -2.f, 0.5f};
  const g::tensor_view<const float> v(f.data(), g::dims{3});
  BOOST_TEST(str(v) == "[0.333333       -2      0.5]");
  BOOST_TEST(str(v, 3) == "[0.333    -2   0.5]");
  const std::vector<double> big{1e20, 1.5e-7};
  BOOST_TEST(str(g::tensor_view<const double>(big.data(), g::dims{2})) == "[  1e+20 1.5e-07]");
}

BOOST_AUTO_TEST_CASE(large_arrays_are_elided_as_numpy_does) {
  // numpy elides past 1000 elements, showing 3 at each end of every long dimension
  std::vector<std::int32_t> a(1001);
  std::iota(a.begin(), a.end(), 0);
  BOOST_TEST(str(g::tensor_view<const std::int32_t>(a.data(), g::dims{1001})) == "[   0    1    2 ...  998  999 1000]");
  BOOST_TEST(str(g::tensor_view<const std::int32_t>(a.data(), g::dims{1000})).find("...") == std::string::npos);

  std::vector<std::int32_t> m(100 * 100);
  std::iota(m.begin(), m.end(), 0);
  const std::string s = str(g::tensor_view<const std::int32_t>(m.data(), g::dims{100, 100}));
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  BOOST_TEST_REQUIRE(lines.size() == 7u);
  BOOST_TEST(lines[0] == "[[   0    1    2 ...   97   98   99]");
  BOOST_TEST(lines[2] == " [ 200  201  202 ...  297  298  299]");
  BOOST_TEST(lines[3] == " ...");
  BOOST_TEST(lines[6] == " [9900 9901 9902 ... 9997 9998 9999]]");
}

#pragma once
// What the ring tests share: each rank's deterministic inputs, a checksum of a result's bits,
// its largest error against a sum computed apart (in double), and the options of a test ring.
#include <boost/test/unit_test.hpp>

#include <gradus/comm/ring.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../support/rank_harness.hpp"

namespace ring_test {

namespace g = gradus;
using gradus_test::rank_result;

// Rank r's input: deterministic, different per rank and element, not exactly summable.
template <class T>
T input(int rank, std::size_t i) {
  std::uint64_t z = (static_cast<std::uint64_t>(rank) + 1) * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  z ^= z >> 31;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 29;
  return static_cast<T>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0) * T(1.000001);
}

template <class T>
std::vector<T> inputs(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = input<T>(rank, i);
  return v;
}

template <class T>
std::uint64_t checksum(const std::vector<T>& v) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the bytes
  const auto* p = reinterpret_cast<const unsigned char*>(v.data());
  for (std::size_t i = 0; i < v.size() * sizeof(T); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// The largest |result - sum of the inputs (in double)| over the elements.
template <class T>
double max_error(const std::vector<T>& got, int world, bool average) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    double s = 0;
    for (int r = 0; r < world; ++r) s += static_cast<double>(input<T>(r, i));
    if (average) s /= world;
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - s));
  }
  return worst;
}

inline void require_no_errors(const std::vector<rank_result>& res) {
  for (std::size_t r = 0; r < res.size(); ++r) BOOST_TEST_REQUIRE(!res[r].error.has_value(), "rank " << r << ": " << *res[r].error);
}

inline g::ring_options options(int rank, int world, std::string rdv, zmq::context_t* ctx = nullptr) {
  g::ring_options o;
  o.rank = rank;
  o.world_size = world;
  o.rendezvous = std::move(rdv);
  o.context = ctx;
  o.timeout = std::chrono::seconds(20);
  return o;
}

}  // namespace ring_test

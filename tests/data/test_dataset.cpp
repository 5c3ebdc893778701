#define BOOST_TEST_MODULE data_dataset
// dataset: shuffle is a seeded permutation (reproducible, epoch- and seed-dependent),
// shard(rank, world) is disjoint and covering for world 1..5, batch keeps or drops the
// partial last batch, map/normalize apply per batch, prefetch yields exactly the batches
// of the plain iteration, a mid-epoch stop does not hang, and a producer's exception
// reaches the consumer.
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

#include <gradus/gradus.hpp>

namespace g = gradus;

namespace {
// example i: features {i, i + 0.5}, label i % 7
g::data::dataset make(std::size_t n) {
  std::vector<float> x(2 * n);
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[2 * i] = static_cast<float>(i);
    x[2 * i + 1] = static_cast<float>(i) + 0.5f;
    y[i] = static_cast<std::int32_t>(i % 7);
  }
  return {std::move(x), g::dims{2}, std::move(y)};
}
// the example ids a pass over the batches yields, checking each example's consistency
std::vector<int> ids(const g::data::dataset::batches& bs, std::vector<g::index_t>* sizes = nullptr) {
  std::vector<int> r;
  for (auto [x, y] : bs) {
    BOOST_TEST_REQUIRE(x.shape().rank == 2u);
    BOOST_TEST_REQUIRE(x.shape().d[1] == 2);
    if (sizes) sizes->push_back(x.shape().d[0]);
    for (g::index_t i = 0; i < x.shape().d[0]; ++i) {
      const int id = static_cast<int>(x[2 * i]);
      BOOST_TEST_REQUIRE(x[2 * i + 1] == static_cast<float>(id) + 0.5f);
      BOOST_TEST_REQUIRE(y[i] == id % 7);
      r.push_back(id);
    }
  }
  return r;
}
}  // namespace

BOOST_AUTO_TEST_CASE(shuffle_is_a_seeded_permutation) {
  const auto d = make(1000);
  const auto a = ids(d.shuffle(3, 0).batch(64)), b = ids(d.shuffle(3, 0).batch(64));
  BOOST_TEST(a == b);  // reproducible
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> all(1000);
  std::iota(all.begin(), all.end(), 0);
  BOOST_TEST(sorted == all);  // a permutation
  BOOST_TEST(a != all);
  BOOST_TEST(ids(d.shuffle(3, 1).batch(64)) != a);  // another epoch
  BOOST_TEST(ids(d.shuffle(4, 0).batch(64)) != a);  // another seed
}

BOOST_AUTO_TEST_CASE(batches_keep_or_drop_the_remainder) {
  const auto d = make(10);
  std::vector<g::index_t> sizes;
  BOOST_TEST(ids(d.batch(4), &sizes).size() == 10u);
  BOOST_TEST(sizes == (std::vector<g::index_t>{4, 4, 2}), boost::test_tools::per_element());
  sizes.clear();
  BOOST_TEST(ids(d.batch(4, true), &sizes).size() == 8u);
  BOOST_TEST(sizes == (std::vector<g::index_t>{4, 4}), boost::test_tools::per_element());
  BOOST_TEST(d.batch(4).count() == 3);
  BOOST_TEST(d.batch(20, true).count() == 0);
  BOOST_TEST(ids(d.batch(20, true)).empty());
}

BOOST_AUTO_TEST_CASE(shards_are_disjoint_and_cover) {
  for (std::size_t n : {0u, 1u, 7u, 100u, 101u})
    for (g::index_t world = 1; world <= 5; ++world) {
      const auto d = make(n).shuffle(9, 2);
      std::multiset<int> seen;
      for (g::index_t r = 0; r < world; ++r) {
        const auto part = ids(d.shard(r, world).batch(3));
        BOOST_TEST(part.size() == (n + static_cast<std::size_t>(world - 1 - r)) / static_cast<std::size_t>(world));
        seen.insert(part.begin(), part.end());
      }
      BOOST_TEST(seen.size() == n);
      BOOST_TEST(std::set<int>(seen.begin(), seen.end()).size() == n);
    }
  BOOST_CHECK_THROW(make(4).shard(2, 2), g::error);
}

BOOST_AUTO_TEST_CASE(map_and_normalize) {
  const auto d = make(5).normalize(1.0f, 2.0f);
  for (auto [x, y] : d.batch(5)) {
    BOOST_TEST(x[0] == (0.0f - 1) / 2);
    BOOST_TEST(x[9] == (4.5f - 1) / 2);
    BOOST_TEST(y[4] == 4);
  }
}

BOOST_AUTO_TEST_CASE(prefetch_gives_the_same_batches) {
  const auto d = make(1003).shuffle(5, 1).shard(1, 2);
  const auto plain = ids(d.batch(32));
  for (int depth : {1, 2, 4}) BOOST_TEST(ids(d.batch(32).prefetch(depth)) == plain);
  // the last partial batch too, and nothing when there are no batches
  BOOST_TEST(ids(make(3).batch(8).prefetch(2)).size() == 3u);
  BOOST_TEST(ids(make(0).batch(8).prefetch(2)).empty());
}

BOOST_AUTO_TEST_CASE(stopping_mid_epoch_and_producer_errors) {
  const auto d = make(10000);
  int seen = 0;
  for (auto [x, y] : d.batch(16).prefetch(3)) {  // leaves with the producer blocked on a full ring
    (void)x;
    (void)y;
    if (++seen == 5) break;
  }
  BOOST_TEST(seen == 5);
  const auto bad = d.map([](float* x, g::index_t, g::index_t) {
    if (x[0] >= 320) throw std::runtime_error("bad example 320");
  });
  int got = 0;
  try {
    for (auto [x, y] : bad.batch(16).prefetch(2)) {
      (void)x;
      (void)y;
      ++got;
    }
    BOOST_FAIL("no error");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()) == "bad example 320");
  }
  BOOST_TEST(got == 20);  // batches 0..19 arrive, batch 20 fails
}

// Features stored as bytes: each batch is byte * scale, the same floats as a dataset made
// from the scaled values (shuffled, sharded, batched alike); a size mismatch is an error.
BOOST_AUTO_TEST_CASE(byte_features_scale_per_batch) {
  const gradus::index_t n = 37, per = 6;
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n * per));
  std::vector<std::int32_t> labels(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>((i * 37 + 11) % 256);
  for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int32_t>(i % 10);
  std::vector<float> scaled(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) scaled[i] = static_cast<float>(bytes[i]) * (1.0f / 255.0f);
  const gradus::data::dataset a(bytes, gradus::dims{per}, labels, 1.0f / 255.0f);
  const gradus::data::dataset b(scaled, gradus::dims{per}, labels);
  BOOST_TEST(a.size() == n);
  std::vector<float> xa, xb;
  std::vector<std::int32_t> ya, yb;
  for (auto [x, y] : a.shuffle(5, 1).shard(1, 2).batch(4)) xa.insert(xa.end(), x.begin(), x.end()), ya.insert(ya.end(), y.begin(), y.end());
  for (auto [x, y] : b.shuffle(5, 1).shard(1, 2).batch(4)) xb.insert(xb.end(), x.begin(), x.end()), yb.insert(yb.end(), y.begin(), y.end());
  BOOST_TEST(xa.size() == static_cast<std::size_t>(18 * per));
  BOOST_TEST(xa == xb);
  BOOST_TEST(ya == yb);
  BOOST_CHECK_EXCEPTION(gradus::data::dataset(std::vector<std::uint8_t>(11), gradus::dims{per}, labels, 1.0f),
                        gradus::shape_error, [](const gradus::shape_error& e) {
                          return std::string(e.what()).find("11 feature bytes do not make 37 examples") != std::string::npos;
                        });
}

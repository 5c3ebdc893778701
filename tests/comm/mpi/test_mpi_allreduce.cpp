#define BOOST_TEST_MODULE mpi_allreduce
// gradus::mpi_allreduce (backends/comm/mpi) under mpirun: CTest runs this program as
// `mpirun -np 2` and `-np 3` (tests/comm/mpi/CMakeLists.txt). Every rank runs every test case and
// every collective, in the same order; checks use BOOST_TEST (not REQUIRE), so that a failed
// check on one rank does not leave the others waiting in a collective. Checked: rank and
// world against MPI_COMM_WORLD and cluster::from_env (OMPI_COMM_WORLD_*); sums and averages
// of rank-dependent values against their closed form, floats and doubles, at sizes that are
// not multiples of the SIMD width, also split into pieces; broadcasts from every root,
// bytes too; the same bits on every rank; a cluster spec that disagrees with MPI; a root
// outside the world; MPI's errors returned (not aborting) and rethrown as comm_error; the
// data-parallel step trains over MPI like one process on the whole batch; averages that
// travel as bf16 or fp16 (fp16 divided first) within their epsilon, the same bits everywhere.
#include <boost/test/unit_test.hpp>

#include <gradus/comm/mpi.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <chrono>
#include <thread>
#include <vector>

#include <gradus/backends/cpu_simd.hpp>
#include <gradus/parallel/cluster.hpp>
#include <gradus/parallel/data_parallel.hpp>
#include <gradus/gradus.hpp>

#include "../../support/tiny_mlp.hpp"

namespace g = gradus;

namespace {

// One mpi_allreduce for the whole program: MPI is initialized once and finalized after the
// last test (it cannot be initialized again).
struct world_fixture {
  world_fixture() { comm = std::make_unique<g::mpi_allreduce>(); }
  ~world_fixture() { comm.reset(); }
  static inline std::unique_ptr<g::mpi_allreduce> comm;
};

g::mpi_allreduce& world() { return *world_fixture::comm; }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// FNV-1a over the bytes of a buffer.
template <class T>
std::uint64_t checksum(std::span<const T> x) {
  std::uint64_t h = 1469598103934665603ull;
  const auto* p = reinterpret_cast<const unsigned char*>(x.data());
  for (std::size_t i = 0; i < x.size_bytes(); ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// Whether every rank has the same checksum (MPI_Allgather on MPI_COMM_WORLD).
bool same_on_every_rank(std::uint64_t h) {
  auto& c = world();
  std::vector<std::uint64_t> all(static_cast<std::size_t>(c.world_size()));
  c.check(MPI_Allgather(&h, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, c.comm()), "MPI_Allgather of 1 checksum");
  for (const auto v : all)
    if (v != all[0]) return false;
  return true;
}

const std::size_t sizes[] = {0, 1, 7, 1000003};

// Rank r's element i: (r + 1) * (i mod 97) + r. Small integers, so every partial sum is
// exact in float too: the sum over N ranks is (i mod 97) * N(N+1)/2 + N(N-1)/2.
template <class T>
std::vector<T> rank_values(std::size_t n, int r) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>((r + 1) * static_cast<int>(i % 97) + r);
  return v;
}
template <class T>
T closed_form_sum(std::size_t i, int N) {
  return static_cast<T>(static_cast<int>(i % 97) * N * (N + 1) / 2 + N * (N - 1) / 2);
}

template <class T>
void check_sum_and_average(g::mpi_allreduce& c, std::size_t n) {
  const int N = c.world_size(), r = c.rank();
  auto s = rank_values<T>(n, r);
  c.allreduce_sum(std::span<T>(s));
  auto a = rank_values<T>(n, r);
  c.allreduce_average(std::span<T>(a));
  const T inv_n = T(1) / static_cast<T>(N);
  std::size_t bad_sum = 0, bad_avg = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const T ref = closed_form_sum<T>(i, N);
    bad_sum += s[i] != ref;
    bad_avg += a[i] != ref * inv_n;  // the exact sum, scaled by the same factor
    if (i < 3) BOOST_TEST(std::abs(static_cast<double>(a[i]) - static_cast<double>(ref) / N) <= 1e-6 * (1 + static_cast<double>(ref)));
  }
  BOOST_TEST(bad_sum == 0u, "allreduce_sum of " << n << ": " << bad_sum << " elements off the closed form");
  BOOST_TEST(bad_avg == 0u, "allreduce_average of " << n << ": " << bad_avg << " elements off the closed form / N");
}

}  // namespace

BOOST_TEST_GLOBAL_FIXTURE(world_fixture);

BOOST_AUTO_TEST_CASE(rank_and_world_are_mpis_and_the_cluster_spec_agrees) {
  auto& c = world();
  int r = -1, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  BOOST_TEST(c.rank() == r);
  BOOST_TEST(c.world_size() == n);
  BOOST_TEST(std::string(g::mpi_allreduce::name) == "mpi");
  int thread_level = 0;
  MPI_Query_thread(&thread_level);
  BOOST_TEST(thread_level >= MPI_THREAD_SERIALIZED);
  // its own communicator, not MPI_COMM_WORLD itself
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(c.comm(), MPI_COMM_WORLD, &cmp);
  BOOST_TEST(cmp == MPI_CONGRUENT);
  // mpirun's OMPI_COMM_WORLD_* variables: cluster::from_env reads them
  const auto spec = g::cluster::from_env();
  BOOST_TEST(spec.source == "openmpi");
  BOOST_TEST(spec.rank == r);
  BOOST_TEST(spec.world_size == n);
  BOOST_TEST(spec.local_rank == r);  // one host
  BOOST_TEST(spec.local_world_size == n);
  // ... and a second communicator from that spec (MPI stays initialized for the first)
  g::mpi_allreduce from_spec(spec);
  BOOST_TEST(from_spec.rank() == r);
  BOOST_TEST(from_spec.world_size() == n);
  from_spec.barrier();
}

BOOST_AUTO_TEST_CASE(sums_and_averages_match_the_closed_form) {
  for (const std::size_t n : sizes) {
    BOOST_TEST_CONTEXT("n = " << n) {
      check_sum_and_average<float>(world(), n);
      check_sum_and_average<double>(world(), n);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_buffer_longer_than_max_count_goes_in_pieces) {
  // max_count stands in for INT_MAX: 1000003 elements in 1001 pieces of at most 1000
  g::mpi_allreduce c(g::mpi_options{.max_count = 1000});
  check_sum_and_average<float>(c, 1000003);
  check_sum_and_average<double>(c, 7);
  std::vector<std::byte> b(2501, std::byte{0});
  if (c.rank() == c.world_size() - 1)
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<std::byte>(i * 7 + 1);
  c.broadcast(std::span<std::byte>(b), c.world_size() - 1);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < b.size(); ++i) bad += b[i] != static_cast<std::byte>(i * 7 + 1);
  BOOST_TEST(bad == 0u);
  BOOST_CHECK_THROW(g::mpi_allreduce(g::mpi_options{.max_count = 0}), g::error);
}

BOOST_AUTO_TEST_CASE(averages_travel_as_bf16_or_fp16_summed_in_fp32) {
  auto& c = world();
  const int N = c.world_size(), r = c.rank();
  // bf16: the closed form within 8 significant bits per reduction step, the same bits everywhere
  for (const std::size_t n : {std::size_t{7}, std::size_t{100003}}) {
    auto a = rank_values<float>(n, r);
    for (auto& v : a) v *= 1.0001f;  // off bf16's grid, so the rounding shows
    c.allreduce_average(std::span<float>(a), g::element_type::bf16);
    double worst = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const double ref = 1.0001 * closed_form_sum<double>(i, N) / N;
      worst = std::max(worst, std::abs(a[i] - ref) / (1 + std::abs(ref)));
    }
    BOOST_TEST(worst <= std::ldexp(1.0, -8) * N, "bf16 average of " << n << ": relative error " << worst);
    BOOST_TEST(worst > 1e-6, "no rounding seen: did the values travel as bf16?");
    BOOST_TEST(same_on_every_rank(checksum(std::span<const float>(a))));
  }
  // fp16: N ranks' 40000s would sum past 65504; divided first, they average to 40000
  std::vector<float> big(1001, 40000.f);
  c.allreduce_average(std::span<float>(big), g::element_type::f16);
  std::size_t off = 0;
  for (float v : big) off += !(std::abs(v - 40000.f) <= 40000.f * std::ldexp(1.f, -10) * N);
  BOOST_TEST(off == 0u, "fp16 average: " << off << " elements off 40000 (overflow?)");
  std::vector<float> x(3, 1.f);
  BOOST_CHECK_EXCEPTION(c.allreduce_average(std::span<float>(x), g::element_type::f64), g::error, [](const g::error& e) {
    return contains(e.what(), "gradients cannot travel as float64");
  });
}

namespace {
template <class T>
void check_broadcast_from(int root, std::size_t n) {
  auto& c = world();
  auto x = rank_values<T>(n, c.rank());
  c.broadcast(std::span<T>(x), root);
  const auto ref = rank_values<T>(n, root);
  BOOST_TEST((n == 0 || std::memcmp(x.data(), ref.data(), n * sizeof(T)) == 0), "from rank " << root << ", n = " << n);
}
}  // namespace

BOOST_AUTO_TEST_CASE(broadcasts_from_every_root_floats_doubles_and_bytes) {
  auto& c = world();
  for (int root = 0; root < c.world_size(); ++root) {
    for (const std::size_t n : sizes) {
      check_broadcast_from<float>(root, n);
      check_broadcast_from<double>(root, n);
      std::vector<std::byte> b(n);
      for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(c.rank()) * 101) & 0xff);
      c.broadcast(std::span<std::byte>(b), root);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) bad += b[i] != static_cast<std::byte>((i * 31 + static_cast<std::size_t>(root) * 101) & 0xff);
      BOOST_TEST(bad == 0u, "bytes from rank " << root << ", n = " << n);
    }
  }
}

BOOST_AUTO_TEST_CASE(every_rank_gets_the_same_bits) {
  // values whose sums round: the order of the additions shows in the last bits
  auto& c = world();
  for (const std::size_t n : sizes) {
    std::vector<double> d(n);
    std::vector<float> f(n);
    for (std::size_t i = 0; i < n; ++i) {
      d[i] = std::sin(0.37 * static_cast<double>(i) + c.rank()) * 1e3 / 3 + 1e-7 * c.rank();
      f[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i) * (c.rank() + 1)) / 7);
    }
    auto d2 = d;
    c.allreduce_sum(std::span<double>(d));
    c.allreduce_average(std::span<double>(d2));
    c.allreduce_average(std::span<float>(f));
    BOOST_TEST(same_on_every_rank(checksum<double>(d)), "allreduce_sum, n = " << n);
    BOOST_TEST(same_on_every_rank(checksum<double>(d2)), "allreduce_average (double), n = " << n);
    BOOST_TEST(same_on_every_rank(checksum<float>(f)), "allreduce_average (float), n = " << n);
  }
}

BOOST_AUTO_TEST_CASE(a_cluster_spec_that_disagrees_with_mpi_fails_naming_both) {
  auto& c = world();
  g::cluster::spec wrong_rank;
  wrong_rank.source = "openmpi";
  wrong_rank.rank = (c.rank() + 1) % c.world_size();
  wrong_rank.world_size = c.world_size();
  const std::string mpi_says = "MPI says rank " + std::to_string(c.rank()) + " of " + std::to_string(c.world_size());
  try {
    g::mpi_allreduce bad(wrong_rank);
    BOOST_ERROR("no error for a spec of rank " << wrong_rank.rank);
  } catch (const g::error& e) {
    const std::string says = "the cluster spec (openmpi) says rank " + std::to_string(wrong_rank.rank) + " of " +
                             std::to_string(c.world_size());
    BOOST_TEST((contains(e.what(), says) && contains(e.what(), mpi_says)), e.what());
  }
  g::cluster::spec wrong_world;
  wrong_world.rank = c.rank();
  wrong_world.world_size = c.world_size() + 1;
  try {
    g::mpi_allreduce bad(wrong_world);
    BOOST_ERROR("no error for a spec of world size " << wrong_world.world_size);
  } catch (const g::error& e) {
    const std::string says = "says rank " + std::to_string(c.rank()) + " of " + std::to_string(c.world_size() + 1);
    BOOST_TEST((contains(e.what(), says) && contains(e.what(), mpi_says)), e.what());
  }
  c.barrier();  // every rank is still in step
}

BOOST_AUTO_TEST_CASE(a_broadcast_from_outside_the_world_fails_naming_the_root) {
  auto& c = world();
  std::vector<float> x(3, 1.f);
  std::vector<std::byte> b(3);
  for (const int root : {c.world_size(), c.world_size() + 5, -1}) {
    const std::string want = "broadcast from rank " + std::to_string(root) + " of a world of " + std::to_string(c.world_size());
    try {
      c.broadcast(std::span<float>(x), root);
      BOOST_ERROR("no error for root " << root);
    } catch (const g::error& e) {
      BOOST_TEST(contains(e.what(), want), e.what());
    }
    BOOST_CHECK_THROW(c.broadcast(std::span<std::byte>(b), root), g::error);
  }
  c.barrier();
}

BOOST_AUTO_TEST_CASE(mpi_errors_are_returned_and_rethrown_as_comm_error) {
  // MPI_ERRORS_RETURN on the communicator: an invalid datatype (checked by every rank
  // before any message moves) comes back as an error code instead of aborting the job
  auto& c = world();
  char one = 0;
  const int rc = MPI_Bcast(&one, 1, MPI_DATATYPE_NULL, 0, c.comm());
  BOOST_TEST(rc != MPI_SUCCESS);
  try {
    c.check(rc, "MPI_Bcast of 1 bytes");
    BOOST_ERROR("no error");
  } catch (const g::comm_error& e) {
    const std::string want = "gradus: mpi_allreduce: MPI_Bcast of 1 bytes failed on rank " + std::to_string(c.rank()) +
                             " of " + std::to_string(c.world_size()) + ": MPI_ERR_TYPE";
    BOOST_TEST(contains(e.what(), want), e.what());
  }
  BOOST_CHECK_NO_THROW(c.check(MPI_SUCCESS, "nothing"));
  c.barrier();
}

// ---- the data-parallel step over MPI (as tests/parallel/test_data_parallel.cpp over threads) ----

namespace {

using gradus_test::batch, gradus_test::n_in, gradus_test::x, gradus_test::y, gradus_test::mlp;
constexpr int steps = 6;
const g::sgd optimizer{.lr = 0.1, .momentum = 0.9};

// This rank on rows [r*batch/N, (r+1)*batch/N) of each batch; only rank 0 initialises like
// the single process (the others start elsewhere: the step broadcasts rank 0's).
std::vector<double> data_parallel(g::mpi_allreduce& comm, const gradus_test::dataset& d, g::parallel::data_parallel_options opts) {
  const int r = comm.rank(), N = comm.world_size();
  mlp m;
  g::session<g::cpu_simd> s;
  m.init(s, r == 0 ? 11 : 500 + static_cast<std::uint64_t>(r));
  auto step = g::parallel::minimize(comm, opts, s, m.loss(), optimizer);
  const g::index_t part = batch / N, lo = r * part;
  for (int k = 0; k < steps; ++k)
    step.run(x = g::view(d.xs.data() + (k * batch + lo) * n_in, {part, n_in}), y = g::view(d.ys.data() + k * batch + lo, {part}));
  step.check_replicas();
  return m.weights(s);
}

}  // namespace

// Sub-groups (parallel::splittable): even and odd ranks each sum within their own group,
// ranked by a reversed key; the sums come from the members' ranks, computed here.
BOOST_AUTO_TEST_CASE(split_makes_groups_ranked_by_key_whose_collectives_stay_inside) {
  auto& c = world();
  const int r = c.rank(), N = c.world_size();
  auto g2 = c.split(r % 2, N - r);  // key N - r: the highest rank of a color is its group's rank 0
  int members = 0, rank_sum = 0, higher = 0;
  for (int q = r % 2; q < N; q += 2) {
    ++members;
    rank_sum += q;
    if (q > r) ++higher;
  }
  BOOST_TEST(g2.world_size() == members);
  BOOST_TEST(g2.rank() == higher);
  std::vector<double> x{static_cast<double>(r), 1.0};
  g2.allreduce_sum(std::span<double>(x));
  BOOST_TEST(x[0] == static_cast<double>(rank_sum));
  BOOST_TEST(x[1] == static_cast<double>(members));
  std::vector<float> b{static_cast<float>(r)};
  g2.broadcast(std::span<float>(b), 0);  // from the group's rank 0: the color's highest rank
  BOOST_TEST(b[0] == static_cast<float>(r % 2 + 2 * ((N - 1 - r % 2) / 2)));
  g2.barrier();
  BOOST_CHECK_EXCEPTION((void)c.split(-1, 0), g::error,
                        [](const g::error& e) { return contains(e.what(), "split with color -1") && contains(e.what(), ">= 0"); });
}

// Point-to-point (parallel::point_to_point): each rank sends to its right neighbour and
// receives from its left, floats, doubles, bytes and an empty message, in order.
BOOST_AUTO_TEST_CASE(send_and_recv_pass_messages_around_the_ranks_in_order) {
  auto& c = world();
  const int r = c.rank(), N = c.world_size();
  if (N < 2) return;
  const int right = (r + 1) % N, left = (r + N - 1) % N;
  std::vector<float> f(1000), gotf(1000);
  std::vector<double> d(3), gotd(3);
  for (std::size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(r * 1000 + static_cast<int>(i)) + 0.5f;
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = r + 0.25 * static_cast<double>(i);
  std::vector<std::byte> bytes{std::byte(r), std::byte(0xA5)}, gotb(2), none, gotnone;
  // even ranks send first, odd ranks receive first: no rank waits on a send that waits on it
  auto sends = [&] {
    c.send(std::span<const float>(f), right);
    c.send(std::span<const double>(d), right);
    c.send(std::span<const std::byte>(bytes), right);
    c.send(std::span<const std::byte>(none), right);
  };
  auto recvs = [&] {
    c.recv(std::span<float>(gotf), left);
    c.recv(std::span<double>(gotd), left);
    c.recv(std::span<std::byte>(gotb), left);
    c.recv(std::span<std::byte>(gotnone), left);
  };
  if (r % 2 == 0) {
    sends();
    recvs();
  } else {
    recvs();
    sends();
  }
  for (std::size_t i = 0; i < gotf.size(); ++i) BOOST_TEST(gotf[i] == static_cast<float>(left * 1000 + static_cast<int>(i)) + 0.5f);
  for (std::size_t i = 0; i < gotd.size(); ++i) BOOST_TEST(gotd[i] == left + 0.25 * static_cast<double>(i));
  BOOST_TEST(static_cast<int>(gotb[0]) == left);
  BOOST_TEST(static_cast<int>(gotb[1]) == 0xA5);
  BOOST_CHECK_EXCEPTION(c.send(std::span<const float>(f), N), g::error,
                        [&](const g::error& e) { return contains(e.what(), "send to rank " + std::to_string(N) + " of a world of"); });
}

// Every rank sends 8 MiB to its right neighbour before it receives (what two pipeline
// stages do, activations one way and gradients the other): a send returns at once, its copy
// in flight (a blocking MPI_Send above the eager limit would wait here for ever), and the
// buffer is free to change at once: the receiver gets what was sent.
BOOST_AUTO_TEST_CASE(sends_return_before_the_peer_receives) {
  auto& c = world();
  const int r = c.rank(), N = c.world_size();
  if (N < 2) return;
  const int right = (r + 1) % N, left = (r + N - 1) % N;
  std::vector<float> big(std::size_t(2) << 20), got(big.size());
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(r) + static_cast<float>(i % 1000) * 0.001f;
  c.send(std::span<const float>(big), right);
  c.send(std::span<const float>(big.data(), 3), right);  // a small one behind it, in order
  std::fill(big.begin(), big.end(), -1.f);             // the sends hold copies
  c.recv(std::span<float>(got), left);
  for (std::size_t i = 0; i < got.size(); i += 4099) BOOST_TEST(got[i] == static_cast<float>(left) + static_cast<float>(i % 1000) * 0.001f);
  std::vector<float> small(3);
  c.recv(std::span<float>(small), left);
  BOOST_TEST(small[2] == static_cast<float>(left) + 0.002f);
  c.barrier();
  for (int i = 0; i < 2000 && c.sends_in_flight() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  BOOST_TEST(c.sends_in_flight() == 0u);  // completed and freed
}

// probe (MPI_Iprobe): false before the left neighbour sent (it sends after a barrier), true
// once its message arrived (a bounded wait), false again after the recv.
BOOST_AUTO_TEST_CASE(probe_says_whether_the_neighbours_message_has_arrived) {
  auto& c = world();
  const int r = c.rank(), N = c.world_size();
  if (N < 2) return;
  const int right = (r + 1) % N, left = (r + N - 1) % N;
  BOOST_TEST(!c.probe(left));
  c.barrier();
  const std::vector<double> x{static_cast<double>(r)};
  c.send(std::span<const double>(x), right);
  bool here = false;
  for (int i = 0; i < 10000 && !(here = c.probe(left)); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  BOOST_TEST(here);
  std::vector<double> y(1);
  c.recv(std::span<double>(y), left);
  BOOST_TEST(y[0] == static_cast<double>(left));
  BOOST_TEST(!c.probe(left));
  c.barrier();
}

// A message of another size is refused, naming the peer and both counts.
BOOST_AUTO_TEST_CASE(a_recv_of_another_size_fails_naming_the_peer_and_both_counts) {
  auto& c = world();
  const int r = c.rank(), N = c.world_size();
  if (N < 2 || r > 1) {
    c.barrier();
    return;
  }
  if (r == 0) {
    std::vector<double> five(5, 1.0);
    c.send(std::span<const double>(five), 1);
    std::vector<double> ok(1);
    c.recv(std::span<double>(ok), 1);  // rank 1 resends the right size once it has refused
    BOOST_TEST(ok[0] == 2.0);
  } else {
    std::vector<double> four(4);
    BOOST_CHECK_EXCEPTION(c.recv(std::span<double>(four), 0), g::comm_error, [](const g::comm_error& e) {
      return contains(e.what(), "expects 4 float64 from rank 0, but its message holds 5");
    });
    std::vector<double> five(5);
    c.recv(std::span<double>(five), 0);  // the refused message is still there
    BOOST_TEST(five[4] == 1.0);
    std::vector<double> two{2.0};
    c.send(std::span<const double>(two), 0);
  }
  c.barrier();
}

BOOST_AUTO_TEST_CASE(the_data_parallel_step_trains_like_one_process_with_identical_replicas) {
  auto& c = world();
  if (batch % c.world_size() != 0) {
    BOOST_TEST_MESSAGE("batch " << batch << " does not split over " << c.world_size() << " ranks: skipped");
    return;
  }
  const auto d = gradus_test::make_data(steps, /*learnable=*/false);
  const auto ref = gradus_test::single_process(d, steps, optimizer);  // every rank: it is small
  // one bucket, then every gradient its own bucket (200 bytes) reduced on the background
  // thread during the backward pass, then the same without overlap
  const g::parallel::data_parallel_options options[] = {{}, {.bucket_bytes = 200}, {.bucket_bytes = 200, .overlap = false}};
  std::vector<double> first;
  for (const auto& opts : options) {
    BOOST_TEST_CONTEXT("bucket_bytes " << opts.bucket_bytes << ", overlap " << opts.overlap) {
      const auto w = data_parallel(c, d, opts);
      BOOST_TEST(w.size() == ref.size());
      for (std::size_t i = 0; i < ref.size() && i < w.size(); ++i) BOOST_TEST(w[i] == ref[i], boost::test_tools::tolerance(1e-10));
      BOOST_TEST(same_on_every_rank(checksum<double>(w)), "the replicas differ");
      if (first.empty()) first = w;
      else BOOST_TEST((w.size() == first.size() && std::memcmp(w.data(), first.data(), w.size() * sizeof(double)) == 0));
    }
  }
}

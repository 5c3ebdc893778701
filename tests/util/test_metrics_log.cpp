#define BOOST_TEST_MODULE util_metrics_log
// The metrics CSV: header once, rows that read back exactly through data::read_csv, and
// appending on resume (rows after the checkpoint's epoch dropped, header not repeated).
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gradus/data/csv.hpp>
#include <gradus/util/metrics_log.hpp>

namespace g = gradus;
namespace gu = gradus::util;
namespace fs = std::filesystem;

namespace {
struct temp_dir {
  fs::path p = fs::temp_directory_path() / ("gradus_metrics_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(p); }
  ~temp_dir() { fs::remove_all(p); }
};
std::string slurp(const fs::path& f) {
  std::ifstream in(f);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}
const std::vector<std::string> cols{"epoch", "step", "train_loss", "test_accuracy", "seconds"};
}  // namespace

BOOST_AUTO_TEST_CASE(rows_round_trip_through_the_csv_reader) {
  temp_dir d;
  const auto f = d.p / "m.csv";
  {
    auto log = gu::metrics_log::create(f, cols);
    log.write({1, 938, 0.1 + 0.2, 0.9612, 4.25});
    // each row is on disk as soon as it is written
    BOOST_TEST(slurp(f) == "epoch,step,train_loss,test_accuracy,seconds\n1,938,0.30000000000000004,0.9612,4.25\n");
    log.write({2, 1876, 1.0 / 3.0, NAN, 8.5});
  }
  const auto t = g::data::read_csv(f.string(), {.allow_nonfinite = true});
  BOOST_TEST(t.columns == cols, boost::test_tools::per_element());
  BOOST_TEST(t.rows == 2);
  BOOST_TEST(t.x[0] == 1.f);
  BOOST_TEST(t.x[1] == 938.f);
  BOOST_TEST(t.x[2] == static_cast<float>(0.1 + 0.2));
  BOOST_TEST(t.x[7] == static_cast<float>(1.0 / 3.0));
  BOOST_TEST(std::isnan(t.x[8]));
  // read_metrics keeps doubles' worth of the shortest text only as far as float goes;
  // the log's own table is exact
  const auto m = gu::read_metrics(f.string());
  BOOST_TEST(m.rows.size() == 2u);
  BOOST_TEST(m.column("step")[1] == 1876.0);
}

BOOST_AUTO_TEST_CASE(append_on_resume_keeps_header_once_and_drops_later_epochs) {
  temp_dir d;
  const auto f = d.p / "m.csv";
  {
    auto log = gu::metrics_log::create(f, cols);
    for (int e = 1; e <= 3; ++e) log.write({double(e), 10.0 * e, 1.0 / (e + 2), 0.5, 1.0});
  }
  {
    // the checkpoint holds 2 epochs: epoch 3's row goes, the resumed epoch 3 is appended;
    // the rows kept read back as the same doubles (and are rewritten as the same text)
    auto log = gu::metrics_log::append(f, cols, 2);
    BOOST_TEST(log.table().rows.size() == 2u);
    BOOST_TEST(log.table().rows[0][2] == 1.0 / 3);
    log.write({3, 30, 0.25, 0.75, 1.0});
    BOOST_TEST(log.table().rows.size() == 3u);
  }
  BOOST_TEST(slurp(f) ==
             "epoch,step,train_loss,test_accuracy,seconds\n1,10,0.3333333333333333,0.5,1\n2,20,0.25,0.5,1\n3,30,0.25,0.75,1\n");
  // a missing file: a new log
  auto fresh = gu::metrics_log::append(d.p / "new.csv", cols, 5);
  fresh.write({1, 1, 1, 1, 1});
  BOOST_TEST(slurp(d.p / "new.csv") == "epoch,step,train_loss,test_accuracy,seconds\n1,1,1,1,1\n");
  // other columns: refused, naming both headers
  try {
    gu::metrics_log::append(f, {"epoch", "loss"});
    BOOST_FAIL("no error");
  } catch (const g::data_error& e) {
    BOOST_TEST(std::string(e.what()).find("its columns are 'epoch,step,train_loss,test_accuracy,seconds', this run logs 'epoch,loss'") !=
               std::string::npos, e.what());
  }
  auto log = gu::metrics_log::create(d.p / "w.csv", cols);
  BOOST_CHECK_THROW(log.write({1, 2}), g::error);
}

BOOST_AUTO_TEST_CASE(append_keeps_rows_whose_first_column_is_nan) {
  temp_dir d;
  const auto f = d.p / "n.csv";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  {
    auto log = gu::metrics_log::create(f, {"epoch", "loss"});
    log.write({1, 0.5});
    log.write({nan, 0.4});  // an evaluation logged without its epoch
    log.write({3, 0.3});
  }
  BOOST_TEST(gu::metrics_log::append(f, {"epoch", "loss"}).table().rows.size() == 3u);  // everything, by default
  const auto kept = gu::metrics_log::append(f, {"epoch", "loss"}, 2).table().rows;
  BOOST_TEST(kept.size() == 2u);
  BOOST_TEST(kept[0][1] == 0.5);
  BOOST_TEST(std::isnan(kept[1][0]));
  BOOST_TEST(kept[1][1] == 0.4);
  BOOST_TEST(slurp(f) == "epoch,loss\n1,0.5\nnan,0.4\n");
}

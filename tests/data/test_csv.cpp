#define BOOST_TEST_MODULE data_csv
// CSV reading: values against hand-written expectations (label by name, class or float
// target, use/skip, delimiter, quotes, CRLF, blank lines, nan policy), a table feeding a
// dataset, and one test per kind of bad file, by message: the file, the line, the column
// and what was expected there. The files are written into a temporary directory.
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <string>
#include <vector>

#include <unistd.h>

#include <gradus/data/csv.hpp>

namespace g = gradus;
namespace gd = gradus::data;
namespace fs = std::filesystem;

namespace {
struct temp_dir {
  fs::path p = fs::temp_directory_path() / ("gradus_csv_" + std::to_string(::getpid()));
  temp_dir() { fs::create_directories(p); }
  ~temp_dir() { fs::remove_all(p); }
  std::string write(const std::string& name, const std::string& text) const {
    const auto f = (p / name).string();
    std::ofstream o(f, std::ios::binary);
    o << text;
    return f;
  }
};
std::string error_of(const std::string& path, const gd::csv_options& opt = {}) {
  try {
    gd::read_csv(path, opt);
  } catch (const g::data_error& e) {
    return e.what();
  }
  return "no error";
}
void has(const std::string& msg, std::initializer_list<const char*> parts) {
  for (const char* p : parts) BOOST_TEST(msg.find(p) != std::string::npos, "'" << p << "' in: " << msg);
}
const std::string people = "age,name,height,label\n34,ann,1.75,1\n51.5,bob,-2e-1,0\n\n7,\"cy\",+3,2\n";
}  // namespace

BOOST_AUTO_TEST_CASE(features_and_class_labels) {
  temp_dir d;
  const auto t = gd::read_csv(d.write("people.csv", people), {.label = "label", .skip = {"name"}});
  BOOST_TEST(t.rows == 3);
  BOOST_TEST(t.cols() == 2);
  BOOST_TEST(t.columns == (std::vector<std::string>{"age", "height"}), boost::test_tools::per_element());
  BOOST_TEST(t.label_name == "label");
  BOOST_TEST(t.shape().rank == 2u);
  BOOST_TEST(t.shape().d[0] == 3);
  BOOST_TEST(t.shape().d[1] == 2);
  // row-major: age, height of each row
  BOOST_TEST(t.x == (std::vector<float>{34.f, 1.75f, 51.5f, -0.2f, 7.f, 3.f}), boost::test_tools::per_element());
  BOOST_TEST(t.labels == (std::vector<std::int32_t>{1, 0, 2}), boost::test_tools::per_element());
  BOOST_TEST(t.targets.empty());
}

BOOST_AUTO_TEST_CASE(float_target_use_order_delimiter_quotes_crlf) {
  temp_dir d;
  const std::string text = "\xEF\xBB\xBF" "a;\"b c\";y\r\n 1 ; \"2.5\" ; 0.125\r\n-4;\"1e3\";7\r\n";
  const auto t = gd::read_csv(d.write("semi.csv", text), {.label = "y",
                                                          .label_as = gd::csv_label::float_target,
                                                          .delimiter = ';',
                                                          .use = {"b c", "a"}});
  BOOST_TEST(t.columns == (std::vector<std::string>{"b c", "a"}), boost::test_tools::per_element());
  BOOST_TEST(t.x == (std::vector<float>{2.5f, 1.f, 1000.f, -4.f}), boost::test_tools::per_element());
  BOOST_TEST(t.targets == (std::vector<float>{0.125f, 7.f}), boost::test_tools::per_element());
  BOOST_TEST(t.labels.empty());

  // a tab delimiter is not trimmed away as blank; a quoted name with a quote inside
  const auto tab = gd::read_csv(d.write("tab.tsv", "p\t\"say \"\"hi\"\"\"\n1\t2\n"), {.delimiter = '\t'});
  BOOST_TEST(tab.columns == (std::vector<std::string>{"p", "say \"hi\""}), boost::test_tools::per_element());
  BOOST_TEST(tab.x == (std::vector<float>{1.f, 2.f}), boost::test_tools::per_element());
  BOOST_TEST(tab.label_name.empty());
}

// Found by tests/fuzz/fuzz_csv (AddressSanitizer: heap-use-after-free): the fields of a
// quoted field with "" inside were views into a vector of strings that moved as it grew, so
// a line's second such field left the first one's view dangling (short strings live inside
// the string object). tools/sanitize.sh asan tests/data/test_csv.cpp shows it.
BOOST_AUTO_TEST_CASE(several_fields_with_doubled_quotes_on_one_line) {
  const std::string text = "\"a\"\"b\",\"c\"\"d\",\"e\"\"f\"\n\"x\"\"y\",\"z\"\"w\",6\n\"\"\"\",\"q\"\"\",\"7\"\n";
  const auto t = gd::parse_csv(text, "quotes.csv", {.skip = {"a\"b", "c\"d"}});
  BOOST_TEST(t.columns == (std::vector<std::string>{"e\"f"}), boost::test_tools::per_element());
  BOOST_TEST(t.x == (std::vector<float>{6.f, 7.f}), boost::test_tools::per_element());
  const auto all = gd::parse_csv("\"a\"\"b\",\"c\"\"d\"\n1,2\n", "q2.csv");
  BOOST_TEST(all.columns == (std::vector<std::string>{"a\"b", "c\"d"}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(nonfinite_policy) {
  temp_dir d;
  const auto f = d.write("nan.csv", "u,v\nnan,1\n2,-inf\n");
  has(error_of(f), {"nan.csv:2: column 'u' (field 1): expected a finite number, got 'nan'", "allow_nonfinite"});
  const auto t = gd::read_csv(f, {.allow_nonfinite = true});
  BOOST_TEST(std::isnan(t.x[0]));
  BOOST_TEST(t.x[1] == 1.f);
  BOOST_TEST(t.x[3] == -std::numeric_limits<float>::infinity());
}

BOOST_AUTO_TEST_CASE(feeds_a_dataset) {
  temp_dir d;
  auto t = gd::read_csv(d.write("people.csv", people), {.label = "label", .num_classes = 3, .skip = {"name"}});
  const auto ds = std::move(t).to_dataset();
  BOOST_TEST(ds.size() == 3);
  int batches = 0;
  for (auto [xb, yb] : ds.batch(2)) {
    if (batches == 1) {  // the last, partial batch: row 3
      BOOST_TEST(xb.shape().d[0] == 1);
      BOOST_TEST(xb[0] == 7.f);
      BOOST_TEST(xb[1] == 3.f);
      BOOST_TEST(yb[0] == 2);
    }
    if (++batches > 2) break;
  }
  BOOST_TEST(batches == 2);
  auto no_label = gd::read_csv(d.write("nolabel.csv", "a\n1\n"));
  BOOST_CHECK_THROW(std::move(no_label).to_dataset(), g::data_error);
}

// ---- bad files: one per kind
BOOST_AUTO_TEST_CASE(bad_number_names_file_line_and_column) {
  temp_dir d;
  has(error_of(d.write("train.csv", "id,age,label\n1,30,0\n2,abc,1\n"), {.label = "label"}),
      {"train.csv:3: column 'age' (field 2): expected a number, got 'abc'"});
  has(error_of(d.write("empty_field.csv", "id,age\n1,\n")), {"empty_field.csv:2: column 'age' (field 2)", "got an empty field"});
  has(error_of(d.write("range.csv", "a\n1e999\n")), {"range.csv:2: column 'a' (field 1): expected a number within float's range, got '1e999'"});
}

BOOST_AUTO_TEST_CASE(wrong_field_count_and_truncated_file) {
  temp_dir d;
  has(error_of(d.write("wide.csv", "a,b\n1,2\n3,4,5\n6,7\n")), {"wide.csv:3: expected 2 fields (as in the header), got 3"});
  const auto msg = error_of(d.write("cut.csv", "a,b,c\n1,2,3\n4,5"));
  has(msg, {"cut.csv:3: expected 3 fields (as in the header), got 2 (is the file truncated?)"});
  has(error_of(d.write("quote.csv", "a,b\n1,\"2\n")), {"quote.csv:2: field 2: expected a closing '\"', got the end of the line"});
}

BOOST_AUTO_TEST_CASE(missing_label_and_unknown_columns) {
  temp_dir d;
  const auto f = d.write("cols.csv", "x1,x2,target\n1,2,3\n");
  has(error_of(f, {.label = "label"}),
      {"cols.csv:1: header: expected a column named 'label' (the label column), the columns are 'x1', 'x2', 'target'"});
  has(error_of(f, {.skip = {"x9"}}), {"cols.csv:1: header: expected a column named 'x9' (in csv_options::skip)"});
  has(error_of(f, {.label = "target", .use = {"target"}}), {"'target' is both in csv_options::use and the label column"});
  has(error_of(d.write("dup.csv", "a,b,a\n1,2,3\n")), {"dup.csv:1: header: column name 'a' appears twice (fields 1 and 3)"});
}

BOOST_AUTO_TEST_CASE(empty_file_and_no_rows) {
  temp_dir d;
  has(error_of(d.write("empty.csv", "")), {"empty.csv: the file is empty: expected a header row of column names"});
  has(error_of(d.write("blank.csv", "\n\r\n  \n")), {"blank.csv: the file is empty"});
  has(error_of(d.write("header_only.csv", "a,b\n")), {"header_only.csv:1: expected data rows after the header"});
  has(error_of((d.p / "absent.csv").string()), {"absent.csv': cannot open it"});
}

BOOST_AUTO_TEST_CASE(bad_class_labels) {
  temp_dir d;
  const gd::csv_options opt{.label = "y", .num_classes = 3};
  has(error_of(d.write("frac.csv", "a,y\n1,0\n2,1.5\n"), opt),
      {"frac.csv:3: column 'y' (field 2): expected an integer class label, got '1.5'"});
  has(error_of(d.write("neg.csv", "a,y\n1,-1\n"), opt), {"neg.csv:2: column 'y' (field 2): expected a class label >= 0, got '-1'"});
  has(error_of(d.write("big.csv", "a,y\n1,3\n"), opt),
      {"big.csv:2: column 'y' (field 2): expected a class label below 3 (csv_options::num_classes), got '3'"});
  has(error_of(d.write("text.csv", "a,y\n1,cat\n"), opt), {"text.csv:2: column 'y' (field 2): expected an integer class label, got 'cat'"});
  // a float target is checked like a feature
  has(error_of(d.write("target.csv", "a,y\n1,inf\n"), {.label = "y", .label_as = gd::csv_label::float_target}),
      {"target.csv:2: column 'y' (field 2): expected a finite number, got 'inf'"});
}

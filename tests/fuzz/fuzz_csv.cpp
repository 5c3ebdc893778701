// libFuzzer target for the CSV reader (gradus/data/csv.hpp): parse_csv on the input's text,
// as read_csv parses a file's. The first byte picks the options (the delimiter, a label
// column "label" read as a class index or a float target, a skipped column "name",
// allow_nonfinite, num_classes); the rest is the text. An accepted table is checked against
// the options (sizes, label range, finite values) and written back as CSV, which must parse
// to the same table: a round trip through the reader. Every refusal is a data_error naming
// the input.
#include "fuzz_check.hpp"

#include <gradus/data/csv.hpp>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace data = gradus::data;
const std::string name = "fuzz.csv";

data::csv_options options(std::uint8_t b) {
  data::csv_options o;
  static constexpr char delimiters[4] = {',', ';', '\t', '|'};
  o.delimiter = delimiters[b & 3];
  switch ((b >> 2) & 3) {
    case 1: o.label = "label"; break;
    case 2: o.label = "label", o.label_as = data::csv_label::float_target; break;
    default: break;
  }
  if (b & 16) o.skip = {"name"};
  o.allow_nonfinite = b & 32;
  o.num_classes = (b & 64) ? 3 : 0;
  return o;
}

// A field the reader gives back as it was (quoted, with its quotes doubled).
std::string field(std::string_view s) {
  std::string q = "\"";
  for (const char c : s) q.append(c == '"' ? 2 : 1, c);
  return q + '"';
}

std::string number(float v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back the same
  FUZZ_CHECK(r.ec == std::errc{});
  return std::string(buf, r.ptr);
}

bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, sizeof a) == 0; }

// The table as CSV: the feature columns, then the label.
std::string write(const data::csv_table& t, char delim) {
  std::string s;
  for (const auto& c : t.columns) s += field(c) + delim;
  if (!t.label_name.empty()) s += field(t.label_name) + delim;
  s.back() = '\n';
  const std::size_t cols = t.columns.size();
  for (std::size_t r = 0; r < static_cast<std::size_t>(t.rows); ++r) {
    for (std::size_t c = 0; c < cols; ++c) s += number(t.x[r * cols + c]) + delim;
    if (!t.labels.empty()) s += std::to_string(t.labels[r]) + delim;
    if (!t.targets.empty()) s += number(t.targets[r]) + delim;
    s.back() = '\n';
  }
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto opt = options(data[0]);
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  data::csv_table t;
  try {
    t = data::parse_csv(text, name, opt);
  } catch (const gradus::data_error& e) {
    FUZZ_CHECK(std::string_view(e.what()).starts_with("gradus: " + name + ":") ||
               std::string_view(e.what()).starts_with("gradus: read_csv '" + name + "'"));
    return 0;
  }

  // What the options promise.
  const bool has_label = !opt.label.empty();
  const auto rows = static_cast<std::size_t>(t.rows);
  FUZZ_CHECK(t.path == name && t.rows > 0 && t.label_name == opt.label);
  FUZZ_CHECK(t.x.size() == rows * t.columns.size());
  FUZZ_CHECK(t.labels.size() == (has_label && opt.label_as == data::csv_label::class_index ? rows : 0));
  FUZZ_CHECK(t.targets.size() == (has_label && opt.label_as == data::csv_label::float_target ? rows : 0));
  for (std::size_t c = 0; c < t.columns.size(); ++c) {
    FUZZ_CHECK(!t.columns[c].empty() && t.columns[c] != opt.label && (opt.skip.empty() || t.columns[c] != "name"));
    for (std::size_t d = 0; d < c; ++d) FUZZ_CHECK(t.columns[c] != t.columns[d]);
  }
  for (const float v : t.x) FUZZ_CHECK(opt.allow_nonfinite || std::isfinite(v));
  for (const float v : t.targets) FUZZ_CHECK(opt.allow_nonfinite || std::isfinite(v));
  for (const auto v : t.labels) FUZZ_CHECK(v >= 0 && (opt.num_classes == 0 || v < opt.num_classes));

  // Written back, it reads the same (no skipped column is left to skip).
  if (t.columns.empty() && !has_label) return 0;  // no column to write
  auto again_opt = opt;
  again_opt.skip.clear();
  data::csv_table u;
  const std::string text2 = write(t, opt.delimiter);
  try {
    u = data::parse_csv(text2, name, again_opt);
  } catch (const gradus::data_error& e) {
    std::fprintf(stderr, "fuzz_csv: the table written back is refused: %s\n", e.what());
    FUZZ_CHECK(false);
  }
  FUZZ_CHECK(u.columns == t.columns && u.rows == t.rows && u.labels == t.labels);
  FUZZ_CHECK(u.x.size() == t.x.size() && u.targets.size() == t.targets.size());
  for (std::size_t i = 0; i < t.x.size(); ++i) FUZZ_CHECK(same(u.x[i], t.x[i]));
  for (std::size_t i = 0; i < t.targets.size(); ++i) FUZZ_CHECK(same(u.targets[i], t.targets[i]));
  return 0;
}

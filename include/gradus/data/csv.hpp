#pragma once
// CSV files with a header row and numeric columns, in the spirit of tf.data's CSV reader:
// the label column is chosen by name, the other columns (or those asked for) become a
// float feature matrix, row-major [rows, cols].
//
//   auto t = g::data::read_csv("heart.csv", {.label = "target"});   // int32 class labels
//   t.x;        // float [t.rows, t.cols()], t.columns names the feature columns
//   t.labels;   // int32 [t.rows]
//   auto ds = std::move(t).to_dataset();          // feeds dataset::shuffle/batch
//   auto r = g::data::read_csv("house.csv", {.label = "price", .label_as = g::data::csv_label::float_target,
//                                            .skip = {"address"}});  // r.targets
//
// Fields may be enclosed in double quotes ("" inside is a quote); spaces around a field
// are ignored; a line ending in \r\n is read as one ending in \n; blank lines are skipped.
// Skipped columns are never parsed, so they may hold text. Every error is a data_error
// naming the file and line, the column (name and field number) where there is one, and
// what was expected there: "train.csv:17: column 'age' (field 3): expected a number,
// got 'abc'".
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <deque>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/core/shape.hpp"
#include "gradus/data/dataset.hpp"

namespace gradus::data {

/// What the label column holds.
enum class csv_label {
  class_index,   ///< int32 labels >= 0 (below num_classes when that is set) in csv_table::labels
  float_target,  ///< float labels in csv_table::targets (regression)
};

/// How read_csv and parse_csv read a file (designated initialisers: `{.label = "target"}`).
struct csv_options {
  std::string label{};                  ///< the label column's name; empty: no label column
  csv_label label_as = csv_label::class_index;  ///< class labels (int32) or float targets
  std::int32_t num_classes = 0;         ///< > 0: class labels must be below it
  char delimiter = ',';                 ///< the field separator (not a quote, a space or a line end)
  std::vector<std::string> use{};       ///< feature columns, in this order; empty: every other column
  std::vector<std::string> skip{};      ///< columns to leave out (never parsed)
  bool allow_nonfinite = false;         ///< accept nan / inf / infinity in features and float targets
};

/// A CSV file read: float features [rows, cols()] and the label column, if any.
struct csv_table {
  std::string path;                     ///< the file (parse_csv's name), as named in errors
  std::vector<std::string> columns;     ///< the feature columns, in the order of x's columns
  std::string label_name;               ///< empty when there is no label column
  index_t rows = 0;                     ///< data rows (blank lines skipped); a file with none is an error
  std::vector<float> x;                 ///< [rows, cols()], row-major
  std::vector<std::int32_t> labels;     ///< [rows] with csv_label::class_index
  std::vector<float> targets;           ///< [rows] with csv_label::float_target

  /// Feature columns: columns.size().
  index_t cols() const { return static_cast<index_t>(columns.size()); }
  /// The features' dims, {rows, cols()}.
  dims shape() const { return dims{rows, cols()}; }
  /// x as a view of shape(), to feed a placeholder; valid while the table lives unchanged.
  tensor_view<const float> features() const { return {x.data(), shape()}; }
  /// The features and class labels as a dataset of examples of shape {cols} (moved out of
  /// the table). Throws data_error where the table has no class labels.
  dataset to_dataset() && {
    if (label_name.empty() || labels.size() != static_cast<std::size_t>(rows))
      throw data_error("gradus: CSV file '" + path + "': to_dataset needs int32 class labels (csv_options::label " +
                       "with csv_label::class_index)");
    return dataset(std::move(x), dims{cols()}, std::move(labels));
  }
};

namespace csv_detail {

/// a space, or a tab where the tab is not the delimiter
inline bool blank(char c, char delim) { return (c == ' ' || c == '\t') && c != delim; }

inline std::string_view trim(std::string_view s, char delim) {
  while (!s.empty() && blank(s.front(), delim)) s.remove_prefix(1);
  while (!s.empty() && blank(s.back(), delim)) s.remove_suffix(1);
  return s;
}

inline std::string quoted(std::string_view s) {
  constexpr std::size_t most = 40;  // a whole corrupt line is not worth printing
  // appended piece by piece: g++ 12 warns falsely (-Wrestrict) on "'" + std::string(s)
  std::string q;
  q.reserve(std::min(s.size(), most) + 5);
  q.push_back('\'');
  q.append(s.substr(0, most));
  if (s.size() > most) q.append("...");
  q.push_back('\'');
  return q;
}

/// Splits one line into fields. Returns an error text (empty when fine). `field` views
/// point into `line`, or into `scratch` for quoted fields with "" inside: a deque, whose
/// strings stay where they are as it grows (a vector's would move, and the views of a
/// line's earlier fields would dangle).
inline std::string split(std::string_view line, char delim, std::vector<std::string_view>& fields,
                         std::deque<std::string>& scratch) {
  fields.clear();
  std::size_t used = 0;
  std::size_t i = 0;
  for (;;) {
    std::size_t j = i;
    while (j < line.size() && blank(line[j], delim)) ++j;
    if (j < line.size() && line[j] == '"') {
      std::string_view body;
      std::size_t k = j + 1;
      bool escaped = false;
      for (; k < line.size(); ++k) {
        if (line[k] != '"') continue;
        if (k + 1 < line.size() && line[k + 1] == '"') {
          escaped = true;
          ++k;
          continue;
        }
        break;
      }
      if (k >= line.size())
        return "field " + std::to_string(fields.size() + 1) + ": expected a closing '\"', got the end of the line";
      body = line.substr(j + 1, k - j - 1);
      if (escaped) {
        if (used == scratch.size()) scratch.emplace_back();
        std::string& s = scratch[used++];
        s.clear();
        for (std::size_t p = 0; p < body.size(); ++p) {
          s.push_back(body[p]);
          if (body[p] == '"') ++p;
        }
        body = s;
      }
      fields.push_back(body);
      std::size_t after = k + 1;
      while (after < line.size() && blank(line[after], delim)) ++after;
      if (after == line.size()) return {};
      if (line[after] != delim)
        return "field " + std::to_string(fields.size()) + ": expected '" + std::string(1, delim) +
               "' or the end of the line after a closing '\"', got " + quoted(line.substr(after));
      i = after + 1;
      continue;
    }
    const std::size_t end = line.find(delim, i);
    if (end == std::string_view::npos) {
      fields.push_back(trim(line.substr(i), delim));
      return {};
    }
    fields.push_back(trim(line.substr(i, end - i), delim));
    i = end + 1;
  }
}

/// from_chars, plus a leading '+' (which from_chars refuses).
template <class T>
inline bool parse_number(std::string_view s, T& v, std::errc& ec) {
  if (s.size() > 1 && s.front() == '+' && s[1] != '-' && s[1] != '+') s.remove_prefix(1);
  const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  ec = r.ec;
  return r.ec == std::errc{} && r.ptr == s.data() + s.size();
}

}  // namespace csv_detail

/// Parses CSV text; `name` stands for the file in error messages.
inline csv_table parse_csv(std::string_view text, const std::string& name, const csv_options& opt = {}) {
  using namespace csv_detail;
  if (opt.delimiter == '"' || opt.delimiter == '\n' || opt.delimiter == '\r' || opt.delimiter == ' ')
    throw data_error("gradus: read_csv '" + name + "': the delimiter cannot be a quote, a space or a line end");
  auto fail = [&](std::int64_t line, const std::string& what) {
    return data_error("gradus: " + name + ":" + std::to_string(line) + ": " + what);
  };

  csv_table t;
  t.path = name;
  std::vector<std::string_view> fields;
  std::deque<std::string> scratch;
  std::size_t pos = 0;
  std::int64_t line_no = 0;
  // the next line that is not blank, without its line end; false at the end of the text
  auto next_line = [&](std::string_view& line) {
    while (pos < text.size()) {
      const std::size_t nl = text.find('\n', pos);
      const std::size_t end = nl == std::string_view::npos ? text.size() : nl;
      line = text.substr(pos, end - pos);
      pos = nl == std::string_view::npos ? text.size() : nl + 1;
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (!trim(line, opt.delimiter).empty()) return true;
    }
    return false;
  };

  // ---- header
  std::string_view line;
  if (text.size() >= 3 && static_cast<unsigned char>(text[0]) == 0xEF && static_cast<unsigned char>(text[1]) == 0xBB &&
      static_cast<unsigned char>(text[2]) == 0xBF)
    pos = 3;  // UTF-8 byte order mark
  if (!next_line(line))
    throw data_error("gradus: " + name + ": the file is empty: expected a header row of column names");
  if (auto e = split(line, opt.delimiter, fields, scratch); !e.empty()) throw fail(line_no, "header: " + e);
  const std::int64_t header_line = line_no;
  std::vector<std::string> header(fields.begin(), fields.end());
  const std::size_t nfields = header.size();
  auto header_list = [&] {
    std::string s;
    for (const auto& h : header) s += (s.empty() ? "'" : ", '") + h + "'";
    return s;
  };
  for (std::size_t c = 0; c < nfields; ++c) {
    if (header[c].empty())
      throw fail(header_line, "header: field " + std::to_string(c + 1) + ": expected a column name, got an empty field");
    for (std::size_t d = 0; d < c; ++d)
      if (header[d] == header[c])
        throw fail(header_line, "header: column name '" + header[c] + "' appears twice (fields " +
                                    std::to_string(d + 1) + " and " + std::to_string(c + 1) + ")");
  }
  auto find = [&](const std::string& col, const char* role) {
    const auto it = std::find(header.begin(), header.end(), col);
    if (it == header.end())
      throw fail(header_line, "header: expected a column named '" + col + "' (" + role + "), the columns are " +
                                  header_list());
    return static_cast<std::size_t>(it - header.begin());
  };

  std::size_t label_col = nfields;  // none
  if (!opt.label.empty()) {
    label_col = find(opt.label, "the label column");
    t.label_name = opt.label;
  }
  std::vector<bool> skipped(nfields, false);
  for (const auto& s : opt.skip) skipped[find(s, "in csv_options::skip")] = true;
  std::vector<std::size_t> feature_cols;
  if (!opt.use.empty()) {
    for (const auto& u : opt.use) {
      const std::size_t c = find(u, "in csv_options::use");
      if (c == label_col || skipped[c])
        throw data_error("gradus: read_csv '" + name + "': column '" + u + "' is both in csv_options::use and " +
                         (c == label_col ? "the label column" : "in csv_options::skip"));
      feature_cols.push_back(c);
    }
  } else {
    for (std::size_t c = 0; c < nfields; ++c)
      if (c != label_col && !skipped[c]) feature_cols.push_back(c);
  }
  for (auto c : feature_cols) t.columns.push_back(header[c]);

  // ---- rows
  const bool want_class = label_col < nfields && opt.label_as == csv_label::class_index;
  const bool want_target = label_col < nfields && opt.label_as == csv_label::float_target;
  auto column = [&](std::size_t c) { return "column '" + header[c] + "' (field " + std::to_string(c + 1) + ")"; };
  auto read_float = [&](std::size_t c, std::string_view s, const char* what) {
    float v = 0;
    std::errc ec{};
    if (s.empty()) throw fail(line_no, column(c) + ": expected " + what + ", got an empty field");
    if (!parse_number(s, v, ec)) {
      if (ec == std::errc::result_out_of_range)
        throw fail(line_no, column(c) + ": expected " + what + " within float's range, got " + quoted(s));
      throw fail(line_no, column(c) + ": expected " + what + ", got " + quoted(s));
    }
    if (!std::isfinite(v) && !opt.allow_nonfinite)
      throw fail(line_no, column(c) + ": expected a finite number, got " + quoted(s) +
                              " (csv_options::allow_nonfinite accepts nan and inf)");
    return v;
  };
  t.x.reserve(text.size() / (2 * std::max<std::size_t>(nfields, 1)) * feature_cols.size());
  while (next_line(line)) {
    if (auto e = split(line, opt.delimiter, fields, scratch); !e.empty()) throw fail(line_no, e);
    if (fields.size() != nfields)
      throw fail(line_no, "expected " + std::to_string(nfields) + " fields (as in the header), got " +
                              std::to_string(fields.size()) +
                              (fields.size() < nfields && pos >= text.size() ? " (is the file truncated?)" : ""));
    for (auto c : feature_cols) t.x.push_back(read_float(c, fields[c], "a number"));
    if (want_target) t.targets.push_back(read_float(label_col, fields[label_col], "a number (the target)"));
    if (want_class) {
      const std::string_view s = fields[label_col];
      std::int32_t v = 0;
      std::errc ec{};
      if (s.empty()) throw fail(line_no, column(label_col) + ": expected an integer class label, got an empty field");
      if (!parse_number(s, v, ec))
        throw fail(line_no, column(label_col) + ": expected an integer class label" +
                                (ec == std::errc::result_out_of_range ? " within int32's range" : "") + ", got " +
                                quoted(s));
      if (v < 0) throw fail(line_no, column(label_col) + ": expected a class label >= 0, got " + quoted(s));
      if (opt.num_classes > 0 && v >= opt.num_classes)
        throw fail(line_no, column(label_col) + ": expected a class label below " + std::to_string(opt.num_classes) +
                                " (csv_options::num_classes), got " + quoted(s));
      t.labels.push_back(v);
    }
    ++t.rows;
  }
  if (t.rows == 0)
    throw fail(header_line, "expected data rows after the header, the file has none");
  return t;
}

/// Reads the CSV file at path (see parse_csv). Throws data_error where it cannot be opened
/// or read, or its text is not what opt asks for (naming the line and column).
inline csv_table read_csv(const std::string& path, const csv_options& opt = {}) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw data_error("gradus: CSV file '" + path + "': cannot open it");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw data_error("gradus: CSV file '" + path + "': reading it failed");
  return parse_csv(buf.view(), path, opt);
}

}  // namespace gradus::data

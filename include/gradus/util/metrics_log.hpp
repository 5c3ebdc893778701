#pragma once
// A CSV log of training metrics, one row per epoch (or per evaluation): the header once,
// each row flushed as soon as it is written, so that a crash loses nothing logged and
// another program (a plot, `tail -f`) sees every row. Numbers are written in their
// shortest round-tripping form; a missing value is `nan`.
//
//   auto log = g::util::metrics_log::create("run/metrics.csv",
//                                           {"epoch", "step", "train_loss", "test_accuracy", "seconds"});
//   log.write({1, 938, 0.31, 0.9612, 4.2});
//
// On resume, append() keeps the rows already there whose first column (the epoch) is at
// most `keep_up_to` — the epochs the checkpoint holds — drops later ones (logged after the
// last checkpoint, they are about to be trained again) and appends after them. The header
// must match. rows() holds every row of the run, old and new, for a plot.
#include <charconv>
#include <cmath>
#include <deque>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string_view>
#include <string>
#include <system_error>
#include <vector>

#include "gradus/core/error.hpp"  // data_error
#include "gradus/core/text.hpp"
#include "gradus/data/csv.hpp"

namespace gradus::util {

/// A metrics CSV in memory: the column names and the rows, each a value per column.
struct metrics_table {
  std::vector<std::string> columns;       ///< the header's names, in order
  std::vector<std::vector<double>> rows;  ///< the rows, each `columns.size()` values (NaN where missing)

  /// the values of one column (empty when there is no such column)
  std::vector<double> column(std::string_view name) const {
    std::vector<double> v;
    for (std::size_t c = 0; c < columns.size(); ++c)
      if (columns[c] == name) {
        v.reserve(rows.size());
        for (const auto& r : rows) v.push_back(r[c]);
      }
    return v;
  }
  /// whether there is a column `name`
  bool has(std::string_view name) const {
    for (const auto& c : columns)
      if (c == name) return true;
    return false;
  }
};

/// Reads a metrics CSV (every column numeric, nan allowed), in double precision:
/// data::read_csv checks it (and names the line of any error), then the fields are read
/// again as doubles, so that a resumed log rewrites its old rows unchanged.
inline metrics_table read_metrics(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw data_error("gradus: metrics file '" + path + "': cannot open it");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  data::csv_options opt;
  opt.allow_nonfinite = true;
  const data::csv_table t = data::parse_csv(text, path, opt);
  metrics_table m{t.columns, {}};
  std::vector<std::string_view> fields;
  std::deque<std::string> scratch;  // csv_detail::split keeps views into it
  std::size_t pos = 0;
  bool header = true;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string::npos) nl = text.size();
    std::string_view line(text.data() + pos, nl - pos);
    pos = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (data::csv_detail::trim(line, ',').empty()) continue;
    if (header) {
      header = false;
      continue;
    }
    data::csv_detail::split(line, ',', fields, scratch);
    std::vector<double> row(fields.size());
    std::errc ec{};
    for (std::size_t c = 0; c < fields.size(); ++c) data::csv_detail::parse_number(fields[c], row[c], ec);
    m.rows.push_back(std::move(row));
  }
  return m;
}

/// A CSV log of training metrics, one row per epoch (or per evaluation): the header once,
/// each row flushed as soon as it is written, numbers in their shortest round-tripping form.
/// create() starts a new log, append() resumes one; the object keeps the file open for
/// appending and every row in table(). Not thread-safe.
class metrics_log {
 public:
  /// A new log: the file is replaced and holds the header (parent directories are created).
  /// Throws gradus::error when `columns` is empty, a name is empty or holds a comma, quote or
  /// line end, or the file cannot be written (std::filesystem::filesystem_error when it cannot
  /// be renamed into place).
  static metrics_log create(const std::filesystem::path& path, std::vector<std::string> columns) {
    metrics_log l(path, std::move(columns));
    l.rewrite();
    return l;
  }

  /// Continues the log at `path` (a new one when there is no such file or it is empty): keeps
  /// the rows whose first column is at most `keep_up_to` (default infinity) or NaN (nothing
  /// says it came later), drops the others and rewrites the file with them. A log whose
  /// columns are not `columns` is a data_error, as is a file that does not read as a metrics
  /// CSV (read_metrics).
  static metrics_log append(const std::filesystem::path& path, std::vector<std::string> columns,
                            double keep_up_to = std::numeric_limits<double>::infinity()) {
    metrics_log l(path, std::move(columns));
    std::error_code ec;
    if (!std::filesystem::exists(path, ec) || std::filesystem::file_size(path, ec) == 0) {
      l.rewrite();
      return l;
    }
    metrics_table old;
    try {
      old = read_metrics(path.string());
    } catch (const data_error& e) {
      // a log with a header and no rows yet is fine; anything else is not
      if (std::string(e.what()).find("expected data rows after the header") == std::string::npos) throw;
      std::ifstream in(path);
      std::string header;
      std::getline(in, header);
      if (!header.empty() && header.back() == '\r') header.pop_back();
      if (header != l.header())
        throw data_error("gradus: metrics_log '" + path.string() + "': its header is '" + header +
                         "', this run logs '" + l.header() + "'; use another file or delete it");
      l.rewrite();
      return l;
    }
    if (old.columns != l.t_.columns)
      throw data_error("gradus: metrics_log '" + path.string() + "': its columns are '" + join(old.columns) +
                       "', this run logs '" + l.header() + "'; use another file or delete it");
    for (auto& r : old.rows)  // a row whose first column is NaN has no place to judge by: kept
      if (!(r[0] > keep_up_to)) l.t_.rows.push_back(std::move(r));
    l.rewrite();
    return l;
  }

  /// Appends a row, `log.write({1, 938, 0.31})`: as the vector overload.
  void write(std::initializer_list<double> values) { write(std::vector<double>(values)); }
  /// Appends a row of one value per column (NaN for a missing one) and flushes it; also adds it
  /// to table(). Throws gradus::error for a row of another length or when the write fails.
  void write(const std::vector<double>& values) {
    if (values.size() != t_.columns.size())
      throw error("gradus: metrics_log '" + path_.string() + "': a row of " + std::to_string(values.size()) +
                  " values for " + std::to_string(t_.columns.size()) + " columns (" + header() + ")");
    out_ << row(values) << '\n' << std::flush;
    if (!out_) throw error("gradus: metrics_log '" + path_.string() + "': writing a row failed");
    t_.rows.push_back(values);
  }

  /// Every row of the run, the kept old ones and those written since (for a plot).
  const metrics_table& table() const { return t_; }
  const std::filesystem::path& path() const { return path_; }  ///< the log's file

  /// shortest text that reads back as the same double; "nan", "inf", "-inf" otherwise
  static std::string format(double v) { return shortest_text(v); }

 private:
  metrics_log(std::filesystem::path path, std::vector<std::string> columns) : path_(std::move(path)) {
    t_.columns = std::move(columns);
    if (t_.columns.empty()) throw error("gradus: metrics_log '" + path_.string() + "': no columns");
    for (const auto& c : t_.columns)
      if (c.empty() || c.find_first_of(",\"\n\r") != std::string::npos)
        throw error("gradus: metrics_log '" + path_.string() + "': column name '" + c +
                    "' is empty or holds a comma, quote or line end");
  }
  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& c : v) {
      if (!s.empty()) s += ',';
      s += c;
    }
    return s;
  }
  std::string header() const { return join(t_.columns); }
  static std::string row(const std::vector<double>& values) {
    std::string s;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (i) s += ',';
      s += format(values[i]);
    }
    return s;
  }
  /// writes the header and the kept rows to a temporary file, renames it over the log (a
  /// crash leaves the old log or the new one), and opens it for appending
  void rewrite() {
    if (out_.is_open()) out_.close();
    if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
    const std::filesystem::path tmp = path_.string() + ".tmp";
    {
      std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
      o << header() << '\n';
      for (const auto& r : t_.rows) o << row(r) << '\n';
      o.flush();
      if (!o) throw error("gradus: metrics_log '" + path_.string() + "': cannot write '" + tmp.string() + "'");
    }
    std::filesystem::rename(tmp, path_);
    out_.open(path_, std::ios::binary | std::ios::app);
    if (!out_) throw error("gradus: metrics_log '" + path_.string() + "': cannot open it for appending");
  }

  std::filesystem::path path_;
  metrics_table t_;
  std::ofstream out_;
};

}  // namespace gradus::util

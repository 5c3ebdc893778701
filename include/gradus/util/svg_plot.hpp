#pragma once
// Line charts as standalone SVG, for training curves: panels side by side, each with its
// axes, ticks at 1-2-5 steps, tick labels, axis titles and a legend (in the corner the
// curves cross least); one <polyline> a series, one point per x value.
//
//   g::util::write_svg("run/curves.svg", g::util::training_curves(log.table()));
//
// training_curves() draws two panels from a metrics table with an "epoch" column: the
// columns whose name holds "loss", and those holding "accuracy".
//
// Coordinates: a panel's plot area spans [left, left + plot_w] x [top, top + plot_h]
// (panel_width / panel_height minus the margins below); an axis runs from lo to hi, the
// data's range widened to whole tick steps (nice_axis), and a value v is drawn at
// x = left + (v - lo) / (hi - lo) * plot_w and y = top + (hi - v) / (hi - lo) * plot_h,
// printed with 2 decimals. Non-finite points are left out.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "gradus/core/error.hpp"
#include "gradus/util/metrics_log.hpp"

namespace gradus::util {

/// One curve: point i is (x[i], y[i]), for i below the shorter length; points with a
/// non-finite coordinate are left out.
struct plot_series {
  std::string name;  ///< its legend entry
  /// the x coordinates
  std::vector<double> x, y;  ///< the y coordinates
};

/// One chart: its titles and curves, drawn in one panel with its own axes and legend.
struct plot_panel {
  /// the title above the panel
  std::string title, x_label, y_label;  ///< the y axis' title
  /// \var x_label
  /// the x axis' title
  std::vector<plot_series> series;  ///< the curves, coloured in turn from a palette of six
  bool integer_x = false;  ///< ticks on whole numbers only (epochs)
};

/// Sizes in SVG user units (pixels): each panel's box, and the margins between its edges and
/// its plot area, which hold the title, tick labels and axis titles.
struct plot_layout {
  /// a panel's width (default 480); the image is this times the number of panels wide
  double panel_width = 480, panel_height = 340;  ///< a panel's and the image's height (default 340)
  /// left margin, for the y tick labels and title (default 64)
  double margin_left = 64, margin_right = 16, margin_top = 36, margin_bottom = 52;
  /// \var margin_right
  /// right margin (default 16)
  /// \var margin_top
  /// top margin, for the panel's title (default 36)
  /// \var margin_bottom
  /// bottom margin, for the x tick labels and title (default 52)
};

/// An axis from lo to hi with ticks every `step` (1, 2 or 5 times a power of ten, about
/// five ticks); lo and hi are the data's min and max rounded out to a multiple of step.
struct nice_axis {
  /// the axis' first value (default 0)
  double lo = 0, hi = 1, step = 0.2;  ///< the distance between ticks (default 0.2)
  /// \var hi
  /// the axis' last value (default 1)

  /// The axis for data in [min, max]: step is 1, 2 or 5 times a power of ten near
  /// `(max - min) / 5` (at least 1 when `integer`), lo and hi min and max rounded out to
  /// multiples of it. A single value (max == min) gets an axis around it; non-finite bounds
  /// give the default axis [0, 1].
  static nice_axis of(double min, double max, bool integer) {
    if (!std::isfinite(min) || !std::isfinite(max)) return {};
    if (max - min <= 0) {  // one value: a unit-wide axis around it
      const double half = min == 0 ? 0.5 : std::abs(min) * 0.1;
      min -= half;
      max += half;
    }
    const double raw = (max - min) / 5;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    const double f = raw / mag;
    double step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    if (integer) step = std::max(step, 1.0);
    nice_axis a;
    a.step = step;
    a.lo = std::floor(min / step + 1e-9) * step;
    a.hi = std::ceil(max / step - 1e-9) * step;
    if (a.hi <= a.lo) a.hi = a.lo + step;
    return a;
  }
};

namespace svg_detail {

inline std::string escape(std::string_view s) {
  std::string r;
  for (char c : s) {
    if (c == '&') r += "&amp;";
    else if (c == '<') r += "&lt;";
    else if (c == '>') r += "&gt;";
    else if (c == '"') r += "&quot;";
    else r += c;
  }
  return r;
}
inline std::string num(double v) {
  char b[48];
  std::snprintf(b, sizeof b, "%.2f", v);
  return b;
}
/// a tick label: as few decimals as the step needs
inline std::string tick_label(double v, double step) {
  int dec = 0;
  for (double s = step; dec < 6 && std::abs(s - std::round(s)) > 1e-9 * std::max(1.0, std::abs(s)); s *= 10) ++dec;
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", dec, std::abs(v) < step * 1e-9 ? 0.0 : v);
  return b;
}
inline constexpr const char* palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"};

}  // namespace svg_detail

/// The panels side by side as one standalone SVG document (text): each with a frame, ticks
/// and tick labels, axis titles, one `polyline` per series and a legend in the corner the
/// curves cross least. Each axis is nice_axis::of the panel's finite data; a panel's plot
/// area spans `[left, left + plot_w] x [top, top + plot_h]` (the panel less the margins), and
/// a point (x, y) is drawn at `left + (x - lo) / (hi - lo) * plot_w`,
/// `top + (hi - y) / (hi - lo) * plot_h` (each axis its own lo, hi), to 2 decimals. Text is
/// XML-escaped.
inline std::string svg_plot(const std::vector<plot_panel>& panels, const plot_layout& L = {}) {
  using namespace svg_detail;
  const double W = L.panel_width * static_cast<double>(std::max<std::size_t>(panels.size(), 1)), H = L.panel_height;
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" viewBox=\"0 0 " +
       num(W) + " " + num(H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" fill=\"white\"/>\n";
  for (std::size_t p = 0; p < panels.size(); ++p) {
    const plot_panel& P = panels[p];
    constexpr double inf = std::numeric_limits<double>::infinity();
    double xmin = inf, xmax = -inf, ymin = inf, ymax = -inf;
    for (const auto& sr : P.series)
      for (std::size_t i = 0; i < std::min(sr.x.size(), sr.y.size()); ++i)
        if (std::isfinite(sr.x[i]) && std::isfinite(sr.y[i])) {
          xmin = std::min(xmin, sr.x[i]);
          xmax = std::max(xmax, sr.x[i]);
          ymin = std::min(ymin, sr.y[i]);
          ymax = std::max(ymax, sr.y[i]);
        }
    const nice_axis ax = nice_axis::of(xmin, xmax, P.integer_x), ay = nice_axis::of(ymin, ymax, false);
    const double left = L.panel_width * static_cast<double>(p) + L.margin_left, top = L.margin_top;
    const double pw = L.panel_width - L.margin_left - L.margin_right, ph = L.panel_height - L.margin_top - L.margin_bottom;
    auto X = [&](double v) { return left + (v - ax.lo) / (ax.hi - ax.lo) * pw; };
    auto Y = [&](double v) { return top + (ay.hi - v) / (ay.hi - ay.lo) * ph; };

    s += "<g class=\"panel\">\n";
    s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(top - 14) +
         "\" text-anchor=\"middle\" font-size=\"14\" font-weight=\"bold\">" + escape(P.title) + "</text>\n";
    s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
         "\" fill=\"none\" stroke=\"#333\"/>\n";
    // ticks: bounded by the axis' own step count (nice_axis gives about 5-10)
    const int nx = static_cast<int>(std::lround((ax.hi - ax.lo) / ax.step));
    for (int i = 0; i <= nx && i <= 100; ++i) {
      const double v = ax.lo + ax.step * i, x = X(v);
      s += "<line x1=\"" + num(x) + "\" y1=\"" + num(top + ph) + "\" x2=\"" + num(x) + "\" y2=\"" + num(top + ph + 5) +
           "\" stroke=\"#333\"/>\n";
      s += "<text x=\"" + num(x) + "\" y=\"" + num(top + ph + 18) + "\" text-anchor=\"middle\">" +
           tick_label(v, ax.step) + "</text>\n";
    }
    const int ny = static_cast<int>(std::lround((ay.hi - ay.lo) / ay.step));
    for (int i = 0; i <= ny && i <= 100; ++i) {
      const double v = ay.lo + ay.step * i, y = Y(v);
      s += "<line x1=\"" + num(left - 5) + "\" y1=\"" + num(y) + "\" x2=\"" + num(left + pw) + "\" y2=\"" + num(y) +
           "\" stroke=\"#ddd\"/>\n";
      s += "<text x=\"" + num(left - 8) + "\" y=\"" + num(y + 4) + "\" text-anchor=\"end\">" + tick_label(v, ay.step) +
           "</text>\n";
    }
    s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(top + ph + 40) + "\" text-anchor=\"middle\">" +
         escape(P.x_label) + "</text>\n";
    s += "<text x=\"" + num(left - 48) + "\" y=\"" + num(top + ph / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 " +
         num(left - 48) + " " + num(top + ph / 2) + ")\">" + escape(P.y_label) + "</text>\n";
    // the legend goes in the plot area's corner the curves cross least (loss curves fall to
    // the bottom right, accuracy curves rise to the top right): each segment is sampled at
    // 16 points and the samples inside each corner's box counted
    const double lw = 130, lh = 8 + 16 * static_cast<double>(P.series.size());
    const double corner_x[4] = {left + pw - lw, left + pw - lw, left + 4, left + 4};
    const double corner_y[4] = {top + 2, top + ph - lh - 2, top + 2, top + ph - lh - 2};
    int hits[4] = {0, 0, 0, 0};
    for (const auto& sr : P.series)
      for (std::size_t i = 1; i < std::min(sr.x.size(), sr.y.size()); ++i) {
        if (!std::isfinite(sr.x[i - 1]) || !std::isfinite(sr.y[i - 1]) || !std::isfinite(sr.x[i]) ||
            !std::isfinite(sr.y[i]))
          continue;
        for (int t = 0; t <= 16; ++t) {
          const double f = t / 16.0, px = X(sr.x[i - 1] + f * (sr.x[i] - sr.x[i - 1])),
                       py = Y(sr.y[i - 1] + f * (sr.y[i] - sr.y[i - 1]));
          for (int c = 0; c < 4; ++c)
            hits[c] += px >= corner_x[c] && px <= corner_x[c] + lw && py >= corner_y[c] && py <= corner_y[c] + lh;
        }
      }
    const int corner = static_cast<int>(std::min_element(hits, hits + 4) - hits);  // first of the least crossed
    for (std::size_t k = 0; k < P.series.size(); ++k) {
      const plot_series& sr = P.series[k];
      const char* colour = palette[k % std::size(palette)];
      s += "<polyline class=\"series\" data-name=\"" + escape(sr.name) + "\" fill=\"none\" stroke=\"" + colour +
           "\" stroke-width=\"2\" points=\"";
      bool first = true;
      for (std::size_t i = 0; i < std::min(sr.x.size(), sr.y.size()); ++i) {
        if (!std::isfinite(sr.x[i]) || !std::isfinite(sr.y[i])) continue;
        if (!first) s += ' ';
        s += num(X(sr.x[i])) + "," + num(Y(sr.y[i]));
        first = false;
      }
      s += "\"/>\n";
      const double ly = corner_y[corner] + 16 + 16 * static_cast<double>(k), lx = corner_x[corner] + 4;
      s += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly - 4) + "\" x2=\"" + num(lx + 20) + "\" y2=\"" + num(ly - 4) +
           "\" stroke=\"" + colour + "\" stroke-width=\"2\"/>\n";
      s += "<text x=\"" + num(lx + 26) + "\" y=\"" + num(ly) + "\">" + escape(sr.name) + "</text>\n";
    }
    s += "</g>\n";
  }
  s += "</svg>\n";
  return s;
}

/// Two panels from a metrics table with an "epoch" column, epochs on x: "loss" with every column
/// whose name holds "loss", and "accuracy" with every column whose name holds "accuracy"
/// (without an "epoch" column the curves are empty).
inline std::vector<plot_panel> training_curves(const metrics_table& m) {
  const std::vector<double> epoch = m.column("epoch");
  plot_panel loss{"loss", "epoch", "loss", {}, true}, acc{"accuracy", "epoch", "accuracy", {}, true};
  for (const auto& c : m.columns) {
    if (c.find("loss") != std::string::npos) loss.series.push_back({c, epoch, m.column(c)});
    if (c.find("accuracy") != std::string::npos) acc.series.push_back({c, epoch, m.column(c)});
  }
  return {loss, acc};
}

/// Writes svg_plot(panels, layout) to `path` atomically (temporary file + rename), so a viewer
/// never sees half of it; parent directories are created. Throws gradus::error when the
/// temporary file cannot be written.
inline void write_svg(const std::filesystem::path& path, const std::vector<plot_panel>& panels,
                      const plot_layout& layout = {}) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream o(tmp, std::ios::binary | std::ios::trunc);
    o << svg_plot(panels, layout);
    o.flush();
    if (!o) throw error("gradus: write_svg '" + path.string() + "': cannot write '" + tmp.string() + "'");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace gradus::util

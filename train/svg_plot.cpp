#include "train/svg_plot.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include "src/errors.h"

namespace flashgpt {
namespace {

constexpr double kWidth = 1020, kHeight = 580;
constexpr double kLeft = 78, kRight = 300, kTop = 64, kBottom = 58;  // margins; legend on the right
constexpr double kPadX = 0.3;  // in powers of two on each side, so edge markers show whole
constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '&') r += "&amp;";
    else if (c == '<') r += "&lt;";
    else if (c == '>') r += "&gt;";
    else r += c;
  }
  return r;
}

// "1K", "64K", "1M" for powers of two; plain numbers otherwise.
std::string size_label(double x) {
  if (x >= 1 << 20 && std::fmod(x, 1 << 20) == 0) return fmt("%.0fM", x / (1 << 20));
  if (x >= 1 << 10 && std::fmod(x, 1 << 10) == 0) return fmt("%.0fK", x / (1 << 10));
  return fmt("%g", x);
}

}  // namespace

std::string render_svg(const LogLogPlot& plot) {
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  auto extend = [&](const PlotPoint& p) {
    if (p.x <= 0 || p.y <= 0) return;
    x0 = std::min(x0, p.x), x1 = std::max(x1, p.x), y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
  };
  for (const auto& s : plot.series)
    for (const auto* pts : {&s.line, &s.measured, &s.failed})
      for (const auto& p : *pts) extend(p);
  FG_ASSERT(std::isfinite(x0), "plot without positive points");
  if (plot.hline > 0) y0 = std::min(y0, plot.hline), y1 = std::max(y1, plot.hline);
  if (plot.y_max > 0) y1 = std::min(y1, plot.y_max);
  if (x1 == x0) x0 /= 2, x1 *= 2;
  // y: whole decades around the data.
  const double ly0 = std::floor(std::log10(y0)), ly1 = std::ceil(std::log10(y1) + 1e-9);
  const double lx0 = std::log2(x0) - kPadX, lx1 = std::log2(x1) + kPadX;
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto X = [&](double x) { return kLeft + (std::log2(x) - lx0) / (lx1 - lx0) * pw; };
  auto Y = [&](double y) { return kTop + ph - (std::log10(y) - ly0) / (ly1 - ly0) * ph; };

  std::string o;
  o += fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" ", kWidth) +
       fmt("height=\"%.0f\" ", kHeight) + fmt("viewBox=\"0 0 %.0f ", kWidth) + fmt("%.0f\" ", kHeight) +
       "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  o += "<clipPath id=\"plot-area\"><rect x=\"" + fmt("%.1f", kLeft) + "\" y=\"" + fmt("%.1f", kTop) +
       "\" width=\"" + fmt("%.1f", pw) + "\" height=\"" + fmt("%.1f", ph) + "\"/></clipPath>\n";
  o += "<text x=\"" + fmt("%.0f", kLeft) + "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">" +
       escape(plot.title) + "</text>\n";
  o += "<text x=\"" + fmt("%.0f", kLeft) + "\" y=\"44\" fill=\"#555\">" + escape(plot.subtitle) + "</text>\n";

  // Grid and ticks: y at 1, 2, 5 × 10^k; x at every power of two (labels on even powers
  // when there are many).
  for (double d = ly0; d <= ly1 + 1e-9; ++d)
    for (double m : {1.0, 2.0, 5.0}) {
      const double y = m * std::pow(10.0, d);
      if (std::log10(y) > ly1 + 1e-9) continue;
      const double py = Y(y);
      o += "<line x1=\"" + fmt("%.1f", kLeft) + "\" x2=\"" + fmt("%.1f", kLeft + pw) + "\" y1=\"" +
           fmt("%.1f", py) + "\" y2=\"" + fmt("%.1f", py) + "\" stroke=\"" + (m == 1 ? "#ccc" : "#eee") + "\"/>\n";
      o += "<text x=\"" + fmt("%.1f", kLeft - 6) + "\" y=\"" + fmt("%.1f", py + 4) +
           "\" text-anchor=\"end\">" + fmt("%g", y) + "</text>\n";
    }
  const int first = int(std::ceil(lx0)), steps = int(std::floor(lx1)) - first;
  for (int k = 0; k <= steps; ++k) {
    const double x = std::pow(2.0, first + k), px = X(x);
    if (px < kLeft - 1 || px > kLeft + pw + 1) continue;
    o += "<line x1=\"" + fmt("%.1f", px) + "\" x2=\"" + fmt("%.1f", px) + "\" y1=\"" + fmt("%.1f", kTop) +
         "\" y2=\"" + fmt("%.1f", kTop + ph) + "\" stroke=\"#eee\"/>\n";
    if (steps <= 12 || k % 2 == 0)
      o += "<text x=\"" + fmt("%.1f", px) + "\" y=\"" + fmt("%.1f", kTop + ph + 18) +
           "\" text-anchor=\"middle\">" + (plot.x_powers_of_two ? size_label(x) : fmt("%g", x)) + "</text>\n";
  }
  o += "<rect x=\"" + fmt("%.1f", kLeft) + "\" y=\"" + fmt("%.1f", kTop) + "\" width=\"" + fmt("%.1f", pw) +
       "\" height=\"" + fmt("%.1f", ph) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  o += "<text x=\"" + fmt("%.1f", kLeft + pw / 2) + "\" y=\"" + fmt("%.1f", kHeight - 14) +
       "\" text-anchor=\"middle\">" + escape(plot.x_label) + "</text>\n";
  o += "<text transform=\"translate(20," + fmt("%.1f", kTop + ph / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       escape(plot.y_label) + "</text>\n";

  if (plot.hline > 0) {
    const double py = Y(plot.hline);
    o += "<line x1=\"" + fmt("%.1f", kLeft) + "\" x2=\"" + fmt("%.1f", kLeft + pw) + "\" y1=\"" + fmt("%.1f", py) +
         "\" y2=\"" + fmt("%.1f", py) + "\" stroke=\"black\" stroke-width=\"2\" stroke-dasharray=\"8,4\"/>\n";
    o += "<text x=\"" + fmt("%.1f", kLeft + 6) + "\" y=\"" + fmt("%.1f", py - 6) + "\">" +
         escape(plot.hline_label) + "</text>\n";
  }

  // Series (clipped to the plot area), and the legend to the right of the plot.
  const double lx = kLeft + pw + 18;
  double ly = kTop + 8;
  std::string legend;
  o += "<g clip-path=\"url(#plot-area)\">\n";
  for (size_t i = 0; i < plot.series.size(); ++i) {
    const PlotSeries& s = plot.series[i];
    const std::string color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    const std::string dash = s.dashed ? " stroke-dasharray=\"5,3\"" : "";
    std::string pts;
    for (const auto& p : s.line)
      if (p.x > 0 && p.y > 0) pts += fmt("%.1f,", X(p.x)) + fmt("%.1f ", Y(p.y));
    if (!pts.empty())
      o += "<polyline fill=\"none\" stroke=\"" + color + "\" stroke-width=\"2\"" + dash + " points=\"" + pts + "\"/>\n";
    for (const auto& p : s.measured)
      o += "<circle cx=\"" + fmt("%.1f", X(p.x)) + "\" cy=\"" + fmt("%.1f", Y(p.y)) + "\" r=\"4.5\" fill=\"" +
           color + "\" stroke=\"white\"/>\n";
    for (const auto& p : s.failed) {
      const double cx = X(p.x), cy = Y(p.y), r = 5;
      o += "<path d=\"M" + fmt("%.1f", cx - r) + "," + fmt("%.1f", cy - r) + " L" + fmt("%.1f", cx + r) + "," +
           fmt("%.1f", cy + r) + " M" + fmt("%.1f", cx - r) + "," + fmt("%.1f", cy + r) + " L" +
           fmt("%.1f", cx + r) + "," + fmt("%.1f", cy - r) + "\" stroke=\"" + color + "\" stroke-width=\"2.5\"/>\n";
    }
    legend += "<line x1=\"" + fmt("%.1f", lx) + "\" x2=\"" + fmt("%.1f", lx + 26) + "\" y1=\"" + fmt("%.1f", ly) +
              "\" y2=\"" + fmt("%.1f", ly) + "\" stroke=\"" + color + "\" stroke-width=\"2\"" + dash + "/>\n";
    legend += "<text x=\"" + fmt("%.1f", lx + 32) + "\" y=\"" + fmt("%.1f", ly + 4) + "\">" + escape(s.label) + "</text>\n";
    ly += 20;
  }
  o += "</g>\n" + legend;
  ly += 8;
  o += "<circle cx=\"" + fmt("%.1f", lx + 13) + "\" cy=\"" + fmt("%.1f", ly) + "\" r=\"4.5\" fill=\"#555\"/>\n";
  o += "<text x=\"" + fmt("%.1f", lx + 32) + "\" y=\"" + fmt("%.1f", ly + 4) + "\">measured</text>\n";
  ly += 20;
  o += "<path d=\"M" + fmt("%.1f", lx + 8) + "," + fmt("%.1f", ly - 5) + " L" + fmt("%.1f", lx + 18) + "," +
       fmt("%.1f", ly + 5) + " M" + fmt("%.1f", lx + 8) + "," + fmt("%.1f", ly + 5) + " L" + fmt("%.1f", lx + 18) +
       "," + fmt("%.1f", ly - 5) + "\" stroke=\"#555\" stroke-width=\"2.5\"/>\n";
  o += "<text x=\"" + fmt("%.1f", lx + 32) + "\" y=\"" + fmt("%.1f", ly + 4) + "\">out of memory</text>\n";
  o += "</svg>\n";
  return o;
}

}  // namespace flashgpt

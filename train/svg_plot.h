// A log-log line plot written as SVG text, for `flashgpt memory --plot`: one line per
// series, measured points marked on it, failed points (out of memory) crossed, a
// horizontal reference line (the GPU's capacity). No dependencies; any browser or
// Markdown viewer shows the file.
#pragma once
#include <string>
#include <vector>

namespace flashgpt {

struct PlotPoint {
  double x = 0, y = 0;
};

struct PlotSeries {
  std::string label;
  bool dashed = false;
  std::vector<PlotPoint> line;      // drawn as a polyline (x ascending)
  std::vector<PlotPoint> measured;  // filled circles
  std::vector<PlotPoint> failed;    // crosses (e.g. out of memory)
};

struct LogLogPlot {
  std::string title, subtitle;
  std::string x_label, y_label;
  bool x_powers_of_two = true;  // x tick labels 1K, 2K, ..., 1M
  std::vector<PlotSeries> series;
  double hline = 0;             // 0: none
  std::string hline_label;
  double y_max = 0;             // > 0: the y axis ends at the decade above this; lines are clipped
};

std::string render_svg(const LogLogPlot& plot);

}  // namespace flashgpt

#include "data/progress.h"

#include <unistd.h>

#include <cstdio>

namespace flashgpt {

namespace {
constexpr double kMB = 1e6;
constexpr int kBarWidth = 30;
}  // namespace

Progress::Progress(std::string label, size_t total_bytes)
    : label_(std::move(label)), total_(total_bytes), tty_(::isatty(STDERR_FILENO) == 1) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void Progress::add(size_t bytes) {
  done_ += bytes;
  auto now = std::chrono::steady_clock::now();
  if (tty_ && std::chrono::duration<double>(now - last_draw_).count() >= kRedrawSeconds) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() { draw(true); }

void Progress::draw(bool final) {
  double s = seconds();
  double rate = s > 0 ? double(done_) / kMB / s : 0.0;
  double fraction = total_ ? double(done_) / double(total_) : 1.0;
  int filled = int(fraction * kBarWidth + 0.5);
  std::string bar(size_t(filled), '#');
  bar.resize(kBarWidth, '.');
  double eta = rate > 0 ? (double(total_ - done_) / kMB) / rate : 0.0;
  std::fprintf(stderr, "%s%s [%s] %.1f/%.1f MB  %.1f MB/s  %s %.0fs%s", tty_ ? "\r" : "", label_.c_str(),
               bar.c_str(), double(done_) / kMB, double(total_) / kMB, rate, final ? "took" : "ETA",
               final ? s : eta, final || !tty_ ? "\n" : "   ");
  std::fflush(stderr);
}

}  // namespace flashgpt

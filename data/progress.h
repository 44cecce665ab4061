// A one-line progress bar on stderr: done/total MB, MB/s, ETA. Redrawn at most every
// kRedrawSeconds, and only when stderr is a terminal (logs get the final line only).
#pragma once
#include <chrono>
#include <cstddef>
#include <string>

namespace flashgpt {

class Progress {
 public:
  Progress(std::string label, size_t total_bytes);
  void add(size_t bytes);  // from one thread
  void finish();           // the final line, always printed
  double seconds() const;

 private:
  void draw(bool final);
  static constexpr double kRedrawSeconds = 0.2;
  std::string label_;
  size_t total_, done_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace flashgpt

// Host-side conversion between raw float storage of any DType (fp32, fp64, bf16) and
// doubles: for initialisation, checkpoints of another precision, and tests.
#pragma once
#include <vector>
#include "src/bf16.h"
#include "src/tensor.h"

namespace flashgpt {

inline std::vector<double> doubles_from_raw(const void* raw, DType dtype, size_t n) {
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::f32) out[i] = static_cast<const float*>(raw)[i];
    else if (dtype == DType::f64) out[i] = static_cast<const double*>(raw)[i];
    else out[i] = bf16_to_double(static_cast<const uint16_t*>(raw)[i]);
  }
  return out;
}

inline void doubles_to_raw(void* raw, DType dtype, const std::vector<double>& v) {
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::f32) static_cast<float*>(raw)[i] = float(v[i]);
    else if (dtype == DType::f64) static_cast<double*>(raw)[i] = v[i];
    else static_cast<uint16_t*>(raw)[i] = double_to_bf16(v[i]);
  }
}

}  // namespace flashgpt

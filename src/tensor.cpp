#include "tensor.h"

namespace flashgpt {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f64: return "fp64";
    case DType::bf16: return "bf16";
    case DType::i32: return "int32";
  }
  return "?";
}

std::string Tensor::shape_str() const {
  std::string s = "(";
  for (int i = 0; i < ndim; ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace flashgpt

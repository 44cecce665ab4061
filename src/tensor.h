// Tensor: a non-owning, contiguous, typed view of memory on one device.
// Memory is owned by arenas (layers/gpt2.cpp, docs/ARCHITECTURE.md); ops receive views.
#pragma once
#include <cstdint>
#include <cstddef>
#include <initializer_list>
#include <string>
#include "errors.h"

namespace flashgpt {

enum class DType : uint8_t { f32, f64, bf16, i32 };
enum class Device : uint8_t { cpu, cuda };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i32: return 4;
  }
  return 0;
}
const char* dtype_name(DType t);

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device = Device::cpu;
  int ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};

  Tensor() = default;
  Tensor(void* d, DType t, Device dev, std::initializer_list<int64_t> dims)
      : data(d), dtype(t), device(dev) {
    FG_ASSERT(dims.size() >= 1 && dims.size() <= 4, "tensor rank must be 1..4");
    for (int64_t s : dims) shape[ndim++] = s;
  }

  bool defined() const { return data != nullptr; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return ndim ? n : 0;
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int64_t size(int i) const { return shape[i < 0 ? ndim + i : i]; }
  template <class T> T* as() const { return static_cast<T*>(data); }

  // View of rows [begin, end) of the first dimension.
  Tensor rows(int64_t begin, int64_t end) const {
    Tensor t = *this;
    int64_t row = numel() / shape[0];
    t.data = static_cast<char*>(data) + size_t(begin * row) * dtype_size(dtype);
    t.shape[0] = end - begin;
    return t;
  }
  // Same memory seen with another shape of the same element count.
  Tensor view(std::initializer_list<int64_t> dims) const {
    Tensor t(data, dtype, device, dims);
    FG_ASSERT(t.numel() == numel(), "view changes the element count");
    return t;
  }
  std::string shape_str() const;
};

}  // namespace flashgpt

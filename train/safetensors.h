// safetensors (https://github.com/huggingface/safetensors), the weight format of Hugging
// Face models:
//   [u64 little-endian N][N bytes of JSON header][data buffer]
// The header maps each tensor name to {"dtype": "F32", "shape": [..], "data_offsets":
// [begin, end]} (byte offsets into the data buffer), plus an optional "__metadata__"
// object of strings. The reader checks everything before any byte of data is used:
// header length within the file and below 100 MB, a JSON object, known dtypes, shapes
// of non-negative integers, end − begin = numel·dtype size, offsets inside the buffer,
// tensors neither overlapping nor leaving holes. Anything else is an InputError naming
// the file, never a crash. Tensors are read from a read-only memory map.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace flashgpt::safetensors {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit

struct TensorInfo {
  std::string name;
  std::string dtype;           // "F32", "BF16", "I64", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0; // byte range in the data buffer
  int64_t numel() const;
};

// Bytes per element of a safetensors dtype; 0 if the name is not a safetensors dtype.
size_t dtype_bytes(const std::string& dtype);

class File {
 public:
  explicit File(const std::string& path);  // maps and validates; InputError if malformed
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // by begin offset
  const TensorInfo* find(const std::string& name) const;              // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor's values as doubles (exact): dtype F64, F32, F16 or BF16, else InputError.
  std::vector<double> to_doubles(const TensorInfo& t) const;
  // The same into `out` (resized to numel, its capacity kept: a caller that reserved more
  // can grow it without a second copy).
  void to_doubles(const TensorInfo& t, std::vector<double>& out) const;
  const unsigned char* bytes(const TensorInfo& t) const { return data_ + t.begin; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // start of the data buffer
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct OutTensor {
  std::string name;
  std::string dtype;  // a safetensors dtype, e.g. F32
  std::vector<int64_t> shape;
};
// The little-endian bytes of tensor i (numel·dtype_bytes of them), asked for in order.
using TensorBytes = std::function<std::vector<unsigned char>(size_t i)>;

// Writes the tensors (in the given order, contiguous) with metadata; the header is padded
// with spaces to a multiple of 8 bytes, as the reference writer does. One tensor is in
// memory at a time. Written to a temporary name and renamed: no partial file is left.
void write(const std::string& path, const std::vector<OutTensor>& tensors,
           const std::map<std::string, std::string>& metadata, const TensorBytes& bytes);

}  // namespace flashgpt::safetensors

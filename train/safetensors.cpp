#include "train/safetensors.h"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include "src/errors.h"
#include "src/json_fields.h"

namespace flashgpt::safetensors {
namespace {

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

double half_to_double(uint16_t h) {  // IEEE binary16
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(double(mant), -24);                       // subnormal
  else if (exp == 31) v = mant ? NAN : INFINITY;
  else v = std::ldexp(double(mant | 0x400), exp - 25);
  return sign ? -v : v;
}

}  // namespace

size_t dtype_bytes(const std::string& d) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1}, {"I8", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"U16", 2}, {"I16", 2},
      {"F16", 2}, {"BF16", 2}, {"U32", 4}, {"I32", 4}, {"F32", 4}, {"U64", 8}, {"I64", 8}, {"F64", 8}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

File::File(const std::string& path) : path_(path) {
  auto bad = [&](const auto&... why) { fail_input(path, ": not a valid safetensors file: ", why...); };
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail_input(path, ": cannot open (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail_input(path, ": not a regular file");
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    bad("it has ", size, " bytes, fewer than the 8 of the header length");
  }
  map_ = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    fail_input(path, ": cannot map (", std::strerror(errno), ")");
  }
  map_bytes_ = size;
  try {
    const auto* base = static_cast<const unsigned char*>(map_);
    const uint64_t n = read_u64_le(base);
    if (n > kMaxHeaderBytes) bad("header length ", n, " is over the ", kMaxHeaderBytes, "-byte limit");
    if (n > size - 8) bad("header length ", n, " runs past the end of the file (", size, " bytes)");
    if (n == 0 || base[8] != '{') bad("the header does not start with '{'");
    data_ = base + 8 + n;
    const uint64_t buffer = size - 8 - n;
    nlohmann::json h;
    try {
      h = parse_json(path_, base + 8, base + 8 + n);
    } catch (const nlohmann::json::exception& e) {
      bad("the header is not JSON (", e.what(), ")");
    }
    if (!h.is_object()) bad("the header is not a JSON object");
    for (auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        if (!v.is_object()) bad("__metadata__ is not an object");
        for (auto& [k, s] : v.items()) {
          if (!s.is_string()) bad("__metadata__ value of '", k, "' is not a string");
          metadata_[k] = s.get<std::string>();
        }
        continue;
      }
      const std::string where = "tensor '" + name + "'";
      if (!v.is_object() || v.size() != 3 || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        bad(where, " must have exactly the keys dtype, shape and data_offsets");
      TensorInfo t;
      t.name = name;
      if (!v["dtype"].is_string()) bad(where, ": dtype is not a string");
      t.dtype = v["dtype"].get<std::string>();
      const size_t es = dtype_bytes(t.dtype);
      if (es == 0) bad(where, ": unknown dtype '", t.dtype, "'");
      if (!v["shape"].is_array()) bad(where, ": shape is not a list");
      uint64_t numel = 1;
      for (const auto& d : v["shape"]) {
        if (!d.is_number_unsigned() || d.get<uint64_t>() > uint64_t(INT64_MAX)) bad(where, ": shape has a bad dimension ", d.dump());
        const uint64_t s = d.get<uint64_t>();
        if (s != 0 && numel > uint64_t(INT64_MAX) / s) bad(where, ": shape ", v["shape"].dump(), " is too large");
        numel *= s;
        t.shape.push_back(int64_t(s));
      }
      const auto& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        bad(where, ": data_offsets must be two non-negative integers, got ", off.dump());
      t.begin = off[0].get<uint64_t>();
      t.end = off[1].get<uint64_t>();
      if (t.begin > t.end) bad(where, ": data_offsets ", off.dump(), " end before they begin");
      if (t.end > buffer) bad(where, ": data_offsets ", off.dump(), " run past the end of the data (", buffer, " bytes)");
      if (numel > uint64_t(INT64_MAX) / es || t.end - t.begin != numel * es)
        bad(where, ": ", t.end - t.begin, " bytes of data for shape ", v["shape"].dump(), " of ", t.dtype,
            " (", numel, " elements of ", es, " bytes)");
      tensors_.push_back(std::move(t));
    }
    // The data buffer must be tiled exactly: no overlaps, no holes (the reference rule).
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (size_t i = 1; i < tensors_.size(); ++i) {
      const TensorInfo &a = tensors_[i - 1], &t = tensors_[i];
      if (t.begin < a.end)
        bad("tensors '", a.name, "' [", a.begin, ", ", a.end, ") and '", t.name, "' [", t.begin, ", ", t.end, ") overlap");
    }
    uint64_t at = 0;
    for (const TensorInfo& t : tensors_) {
      if (t.begin > at) bad("bytes [", at, ", ", t.begin, ") of the data belong to no tensor");
      at = t.end;
    }
    if (at != buffer) bad("bytes [", at, ", ", buffer, ") at the end of the data belong to no tensor");
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

File::~File() {
  if (map_) ::munmap(map_, map_bytes_);
}

const TensorInfo* File::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<double> File::to_doubles(const TensorInfo& t) const {
  std::vector<double> out;
  to_doubles(t, out);
  return out;
}

void File::to_doubles(const TensorInfo& t, std::vector<double>& out) const {
  const size_t n = size_t(t.numel());
  out.resize(n);
  const unsigned char* p = bytes(t);  // may be unaligned: copy element by element
  if (t.dtype == "F64") {
    for (size_t i = 0; i < n; ++i) std::memcpy(&out[i], p + 8 * i, 8);
  } else if (t.dtype == "F32") {
    for (size_t i = 0; i < n; ++i) { float f; std::memcpy(&f, p + 4 * i, 4); out[i] = f; }
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const bool bf = t.dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      uint16_t h = uint16_t(p[2 * i] | (p[2 * i + 1] << 8));
      if (bf) { uint32_t u = uint32_t(h) << 16; float f; std::memcpy(&f, &u, 4); out[i] = f; }
      else out[i] = half_to_double(h);
    }
  } else {
    fail_input(path_, ": tensor '", t.name, "' has dtype ", t.dtype, "; expected floating point weights (F32, F64, BF16 or F16)");
  }
}

void write(const std::string& path, const std::vector<OutTensor>& tensors,
           const std::map<std::string, std::string>& metadata, const TensorBytes& bytes) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  uint64_t at = 0;
  std::vector<uint64_t> sizes;
  for (const auto& t : tensors) {
    const size_t es = dtype_bytes(t.dtype);
    FG_ASSERT(es != 0, "unknown safetensors dtype ", t.dtype);
    uint64_t n = 1;
    for (int64_t s : t.shape) n *= uint64_t(s);
    sizes.push_back(n * es);
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + n * es}}};
    at += n * es;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(header.data(), std::streamsize(header.size()));
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::vector<unsigned char> data = bytes(i);
      FG_ASSERT(data.size() == sizes[i], "tensor ", tensors[i].name, ": ", data.size(), " bytes, its shape needs ", sizes[i]);
      f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
    }
    f.flush();
    if (!f) fail("cannot write '", tmp, "'");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace flashgpt::safetensors

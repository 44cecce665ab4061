#include "train/checkpoint.h"
#include <algorithm>
#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>
#include "src/checksum.h"
#include "src/errors.h"
#include "src/host_floats.h"
#include "src/json_fields.h"

namespace fs = std::filesystem;

namespace flashgpt {
namespace {

constexpr char kModelMagic[8] = {'F', 'G', 'P', 'T', 'M', 'D', 'L', '1'};
constexpr char kOptMagic[8] = {'F', 'G', 'P', 'T', 'O', 'P', 'T', '1'};

// checksums.json: {"algorithm": "crc32c", "files": {name: CRC-32C, ...}} (src/checksum.h).
// Checkpoints written before it (a flat {name: sum}, src/checksum.h LegacyFnv64) are still verified.
constexpr char kChecksumAlgorithm[] = "crc32c";

// The checksum of a file, read in pieces (a checkpoint's optimizer state is never held
// in memory twice just to be checked).
template <class Sum>
uint64_t file_checksum(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail_input("checkpoint file '", p.string(), "' is missing or unreadable");
  Sum sum;
  std::vector<char> buf(size_t(1) << 20);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    sum.add(buf.data(), size_t(f.gcount()));
  }
  return sum.value();
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail_input("checkpoint file '", p.string(), "' is missing or unreadable");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

// Durable writes: the data is on the disk (fsync) before the file is renamed into
// place, and each rename is made durable by an fsync of its directory. Without that, a
// power loss can leave a renamed checkpoint (or `latest`) pointing at blocks never written.
// A file is written in pieces (append), its checksum taken on the way, so the weights and
// the optimizer state go from their host copies straight to the disk.
class DurableFile {
 public:
  explicit DurableFile(fs::path p) : path_(std::move(p)) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create '", path_.string(), "': ", std::strerror(errno));
  }
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;
  ~DurableFile() {
    if (fd_ >= 0) ::close(fd_);  // only after a failure: finish() closes
  }
  void append(const char* p, size_t bytes) {
    sum_.add(p, bytes);
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::write(fd_, p + done, bytes - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("cannot write '", path_.string(), "': ", std::strerror(errno));
      done += size_t(n);
    }
  }
  void append(const std::string& s) { append(s.data(), s.size()); }
  // fsync and close; returns the file's checksum.
  uint32_t finish() {
    if (::fsync(fd_) != 0) fail("cannot fsync '", path_.string(), "': ", std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close '", path_.string(), "': ", std::strerror(errno));
    return sum_.value();
  }

 private:
  fs::path path_;
  int fd_ = -1;
  Crc32c sum_;
};

uint32_t write_file(const fs::path& p, const std::string& bytes) {
  DurableFile f(p);
  f.append(bytes);
  return f.finish();
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail("cannot open directory '", dir.string(), "': ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int e = errno;
  ::close(fd);
  if (rc != 0) fail("cannot fsync directory '", dir.string(), "': ", std::strerror(e));
}

bool is_temporary(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0;
}

// Whether checkpoint `dir` holds exactly the files whose checksums are `sums`.
bool same_checksums(const fs::path& dir, const nlohmann::json& sums) {
  std::ifstream f(dir / "checksums.json");
  std::stringstream text;
  text << f.rdbuf();
  return f && text.str() == sums.dump(1);
}

// Puts the complete checkpoint `fresh` in the place of `old` (the same step), whose
// directory `latest` may name: it must not be missing even for a moment. Linux swaps the
// two atomically (renameat2 RENAME_EXCHANGE); a file system that cannot falls back to two
// renames (the old one first to a *.tmp name, which nothing loads and the next save removes).
// FLASHGPT_TEST_NO_RENAME_EXCHANGE=1 takes the fallback (tests: this machine has the swap).
void replace_checkpoint(const fs::path& old, const fs::path& fresh) {
  const bool exchange = std::getenv("FLASHGPT_TEST_NO_RENAME_EXCHANGE") == nullptr;
  if (exchange && ::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, old.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(fresh);  // now the old one
    return;
  }
  const fs::path aside = old.string() + ".replaced.tmp";
  fs::remove_all(aside);
  fs::rename(old, aside);
  fs::rename(fresh, old);
  fs::remove_all(aside);
}

// ckpt_NNNNNN directories of a run, oldest first (by step; never the *.tmp ones).
std::vector<fs::path> complete_checkpoints(const fs::path& out_dir) {
  std::vector<std::pair<long, fs::path>> found;
  for (const auto& e : fs::directory_iterator(out_dir)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || is_temporary(e.path()) || n.rfind("ckpt_", 0) != 0) continue;
    char* end = nullptr;
    const long step = std::strtol(n.c_str() + 5, &end, 10);
    if (*end == '\0') found.emplace_back(step, e.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

// A file of tensors: [magic 8][json length u64][json][raw tensors...]. This writes the
// part before the tensors (append_packed the rest).
void append_header(DurableFile& f, const char magic[8], const nlohmann::json& header) {
  const std::string h = header.dump();
  const uint64_t n = h.size();
  f.append(magic, 8);
  f.append(reinterpret_cast<const char*>(&n), 8);
  f.append(h);
}

// A file of tensors opened for reading: its header, then its tensors read in pieces
// straight into their destinations (the file is never held in memory whole).
class TensorFile {
 public:
  TensorFile(const fs::path& p, const char magic[8]) : what_(p.string()), f_(p, std::ios::binary) {
    if (!f_) fail_input("checkpoint file '", what_, "' is missing or unreadable");
    std::error_code ec;
    const uint64_t size = fs::file_size(p, ec);
    char head[16];
    if (ec || size < 16 || !f_.read(head, 16) || std::memcmp(head, magic, 8) != 0)
      fail_input(what_, " is not a flashgpt file (bad magic)");
    uint64_t n;
    std::memcpy(&n, head + 8, 8);
    if (n > size - 16) fail_input(what_, " is truncated (header)");
    std::string text(n, '\0');
    if (!f_.read(text.data(), std::streamsize(n))) fail_input(what_, " is truncated (header)");
    try {
      header_ = parse_json(what_, text);
    } catch (const nlohmann::json::exception&) {
      fail_input(what_, " has a corrupt header");
    }
    data_offset_ = 16 + n;
    data_bytes_ = size - data_offset_;
  }
  const std::string& what() const { return what_; }
  const nlohmann::json& header() const { return header_; }
  uint64_t data_bytes() const { return data_bytes_; }  // what follows the header
  // `bytes` bytes from `offset` within the data (the caller checked the range).
  void read(uint64_t offset, char* dst, size_t bytes) {
    f_.seekg(std::streamoff(data_offset_ + offset));
    if (!f_.read(dst, std::streamsize(bytes))) fail_input(what_, " could not be read (truncated?)");
  }

 private:
  std::string what_;
  std::ifstream f_;
  nlohmann::json header_;
  uint64_t data_offset_ = 0, data_bytes_ = 0;
};

// Every file the caller needs must be listed, and every listed file must match: an
// emptied checksums.json cannot switch verification off. only_required: the other
// listed files are not read (the config alone, before the model is built).
void verify_checksums(const fs::path& dir, std::initializer_list<const char*> required, bool only_required = false) {
  nlohmann::json sums;
  try {
    sums = parse_json((dir / "checksums.json").string(), read_file(dir / "checksums.json"));
  } catch (const nlohmann::json::exception&) {
    fail_input("checkpoint '", dir.string(), "': checksums.json is corrupt");
  }
  if (!sums.is_object()) fail_input("checkpoint '", dir.string(), "': checksums.json is not an object");
  // CRC-32C under "files", or (checkpoints written before it) a flat object of LegacyFnv64 sums.
  const bool legacy = !sums.contains("files");
  if (!legacy) {
    const nlohmann::json& algorithm = sums.contains("algorithm") ? sums["algorithm"] : nlohmann::json();
    if (algorithm != kChecksumAlgorithm)
      fail_input("checkpoint '", dir.string(), "': checksums.json names the algorithm ", algorithm.dump(),
                 ", expected \"", kChecksumAlgorithm, "\"");
    if (sums.size() != 2) fail_input("checkpoint '", dir.string(), "': checksums.json has keys besides algorithm and files");
    nlohmann::json files = std::move(sums["files"]);
    sums = std::move(files);
    if (!sums.is_object()) fail_input("checkpoint '", dir.string(), "': checksums.json's files is not an object");
  }
  for (const char* name : required)
    if (!sums.contains(name))
      fail_input("checkpoint '", dir.string(), "': checksums.json does not list ", name, " (corrupt or incomplete)");
  for (auto& [name, sum] : sums.items()) {
    if (!sum.is_number_unsigned() || name.find('/') != std::string::npos)
      fail_input("checkpoint '", dir.string(), "': checksums.json has a malformed entry '", name, "'");
    if (only_required && std::find_if(required.begin(), required.end(), [&](const char* r) { return name == r; }) ==
                             required.end())
      continue;
    if (!legacy && sum.get<uint64_t>() > UINT32_MAX)
      fail_input("checkpoint '", dir.string(), "': checksums.json has a malformed entry '", name, "'");
    if ((legacy ? file_checksum<LegacyFnv64>(dir / name) : file_checksum<Crc32c>(dir / name)) != sum.get<uint64_t>())
      fail_input("checkpoint '", dir.string(), "': ", name, " does not match its checksum (corrupt or truncated)");
  }
}

DType dtype_from(const std::string& s, const std::string& what) {
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    if (s == dtype_name(d)) return d;
  fail_input(what, ": unknown dtype '", s, "'");
}

// Parameters in the packed order (no padding), from an arena-layout host buffer.
void append_packed(DurableFile& f, const GPT2& model, const std::string& arena, DType dtype) {
  const size_t es = dtype_size(dtype);
  for (const ParamInfo& p : model.param_list()) f.append(arena.data() + p.offset * es, size_t(p.numel()) * es);
}

// The model's weights in the packed order, copied to the host a tensor at a time (one
// buffer of the largest, reused): a save holds no second copy of the weights.
void append_weights(DurableFile& f, GPT2& model) {
  std::string buf;
  for (const ParamInfo& p : model.param_list()) {
    const Tensor t = model.param(p);
    buf.resize(t.nbytes());
    model.ops().to_host(buf.data(), t);
    f.append(buf);
  }
}

// The file's tensor entries (header "params": name, offset, shape of each; offsets in
// elements from the start of a packed block of `data_elems` elements), checked against
// `model`'s parameter list: the offsets, in parameter order.
std::vector<uint64_t> packed_offsets(const GPT2& model, const TensorFile& file, size_t data_elems) {
  const nlohmann::json& entries = file.header().at("params");
  const std::string& what = file.what();
  const auto& list = model.param_list();
  if (!entries.is_array() || entries.size() != list.size())
    fail_input(what, " holds ", entries.is_array() ? entries.size() : 0, " tensors, this model has ", list.size());
  std::vector<uint64_t> offsets;
  for (size_t i = 0; i < list.size(); ++i) {
    const ParamInfo& p = list[i];
    const auto& e = entries[i];
    if (e.at("name") != p.name || e.at("shape") != nlohmann::json(p.shape))
      fail_input(what, ": tensor ", i, " is ", e.at("name").dump(), " ", e.at("shape").dump(), ", expected '", p.name,
                 "' ", nlohmann::json(p.shape).dump());
    const uint64_t off = json_uint(e, "offset", cat(what, ": tensor '", p.name, "'"));
    if (off > data_elems || data_elems - off < uint64_t(p.numel()))
      fail_input(what, ": tensor '", p.name, "' lies outside the file (corrupt or truncated)");
    offsets.push_back(off);
  }
  return offsets;
}

// Each tensor of the packed block at `base` (`data_elems` elements of src_dtype), read in
// dtype `dst_dtype`: `take(param, bytes)` gets it, one tensor at a time (the block is
// never in memory whole). Every entry is checked before any tensor is handed over.
template <class Take>
void for_each_packed(const GPT2& model, TensorFile& file, uint64_t base, size_t data_elems, DType src_dtype,
                     DType dst_dtype, Take take) {
  const std::vector<uint64_t> offsets = packed_offsets(model, file, data_elems);
  const auto& list = model.param_list();
  const size_t ses = dtype_size(src_dtype), des = dtype_size(dst_dtype);
  std::vector<char> buf, src;
  for (size_t i = 0; i < list.size(); ++i) {
    const ParamInfo& p = list[i];
    const uint64_t off = offsets[i];
    buf.resize(size_t(p.numel()) * des);
    if (src_dtype == dst_dtype) {
      file.read(base + off * ses, buf.data(), buf.size());
    } else {  // e.g. a bf16 checkpoint loaded for a CPU run
      src.resize(size_t(p.numel()) * ses);
      file.read(base + off * ses, src.data(), src.size());
      doubles_to_raw(buf.data(), dst_dtype, doubles_from_raw(src.data(), src_dtype, size_t(p.numel())));
    }
    take(p, buf.data());
  }
}

// The same block as one arena-layout host buffer for `model` (padding zero).
std::string unpack_params(const GPT2& model, TensorFile& file, uint64_t base, size_t data_elems, DType dtype) {
  const size_t es = dtype_size(dtype);
  std::string raw(model.num_params() * es, '\0');
  for_each_packed(model, file, base, data_elems, dtype, dtype, [&](const ParamInfo& p, const char* data) {
    std::memcpy(raw.data() + p.offset * es, data, size_t(p.numel()) * es);
  });
  return raw;
}

nlohmann::json param_entries(const GPT2& model) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& p : model.param_list()) names.push_back({{"name", p.name}, {"offset", p.packed}, {"shape", p.shape}});
  return names;
}

// The model-shape fields of a model.bin header (not its list of tensors).
nlohmann::json shape_of(const nlohmann::json& h) {
  nlohmann::json shape;
  for (const char* k : {"n_layer", "n_head", "n_embd", "vocab_size", "padded_vocab", "max_seq_len"}) shape[k] = h.at(k);
  return shape;
}

void load_weights_file(const fs::path& dir, GPT2& model) {
  TensorFile file(dir / "model.bin", kModelMagic);
  const std::string& what = file.what();
  const nlohmann::json& h = file.header();
  const auto& c = model.config();
  try {
    if (h.at("n_layer") != c.n_layer || h.at("n_head") != c.n_head || h.at("n_embd") != c.n_embd ||
        h.at("vocab_size") != c.vocab_size || h.at("padded_vocab") != c.padded_vocab ||
        h.at("max_seq_len") != c.max_seq_len)
      fail_input("checkpoint '", dir.string(), "' was made for another model shape: ", shape_of(h).dump());
    DType d = dtype_from(h.at("dtype").get<std::string>(), what);
    const uint64_t n = json_uint(h, "numel", what);
    if (n > file.data_bytes() / dtype_size(d) || n * dtype_size(d) != file.data_bytes())
      fail_input(what, " has the wrong size (corrupt or truncated)");
    // Each tensor straight into its place in the parameters (the padding between them
    // stays as the model was built: zero).
    for_each_packed(model, file, 0, n, d, model.dtype(), [&](const ParamInfo& p, const char* data) {
      model.ops().from_host(model.param(p), data);
    });
  } catch (const nlohmann::json::exception& e) {
    fail_input(what, " has a malformed header: ", e.what());
  }
}

}  // namespace

Config load_checkpoint_config(const std::string& ckpt_dir) {
  const fs::path dir(ckpt_dir);
  verify_checksums(dir, {"config.yaml"}, /*only_required=*/true);
  return load_config((dir / "config.yaml").string(), {});
}

std::string save_checkpoint(const std::string& out_dir, const GPT2& model, const OptimizerSource* opt,
                            const CheckpointState& st, const std::string& config_yaml, int keep) {
  GPT2& m = const_cast<GPT2&>(model);
  char name[32];
  std::snprintf(name, sizeof name, "ckpt_%06d", st.step);
  const fs::path out(out_dir);
  fs::path final_dir = out / name;
  fs::path tmp_dir = out / (std::string(name) + ".tmp");
  fs::create_directories(out);
  // What a killed save left behind (never loaded: resolve_checkpoint refuses *.tmp).
  for (const auto& e : fs::directory_iterator(out))
    if (is_temporary(e.path())) fs::remove_all(e.path());
  fs::create_directories(tmp_dir);

  const auto& c = model.config();
  nlohmann::json mh = {{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
                       {"vocab_size", c.vocab_size}, {"padded_vocab", c.padded_vocab},
                       {"max_seq_len", c.max_seq_len}, {"dtype", dtype_name(model.dtype())},
                       {"numel", model.num_packed()}, {"params", param_entries(model)}};
  // The weights go to the file a tensor at a time; each optimizer tensor streams from one
  // host copy of its arena (never all packed in memory first: the optimizer state of a
  // large model is several of its sizes).
  nlohmann::json files;  // each file's checksum
  {
    DurableFile f(tmp_dir / "model.bin");
    append_header(f, kModelMagic, mh);
    append_weights(f, m);
    files["model.bin"] = f.finish();
  }
  if (opt) {
    FG_ASSERT(opt->count == 2 || opt->count == 3, "optimizer state of ", opt->count, " tensors");
    nlohmann::json oh = {{"step", opt->step}, {"dtype", dtype_name(opt->dtype)}, {"numel", model.num_packed()},
                         {"master", opt->count == 3}, {"params", param_entries(model)}};
    DurableFile f(tmp_dir / "optimizer.bin");
    append_header(f, kOptMagic, oh);
    std::string t;  // one tensor at a time, the buffer reused
    for (int k = 0; k < opt->count; ++k) {
      opt->fetch(k, t);
      FG_ASSERT(t.size() == model.num_params() * dtype_size(opt->dtype), "optimizer state tensor ", k,
                " has the wrong size");
      append_packed(f, model, t, opt->dtype);
    }
    files["optimizer.bin"] = f.finish();
  }
  files["state.json"] =
      write_file(tmp_dir / "state.json", nlohmann::json{{"step", st.step}, {"loader", st.loader}, {"extra", st.extra}}.dump(1));
  files["config.yaml"] = write_file(tmp_dir / "config.yaml", config_yaml);
  const nlohmann::json sums = {{"algorithm", kChecksumAlgorithm}, {"files", std::move(files)}};
  write_file(tmp_dir / "checksums.json", sums.dump(1));
  fsync_dir(tmp_dir);
  // Complete and on disk: move it into place, then point `latest` at it.
  if (!fs::exists(final_dir)) fs::rename(tmp_dir, final_dir);
  else if (same_checksums(final_dir, sums)) fs::remove_all(tmp_dir);  // e.g. a stop right after a periodic save
  else replace_checkpoint(final_dir, tmp_dir);  // a run resumed from an earlier step, with other settings
  fsync_dir(out);
  write_file(out / "latest.tmp", std::string(name) + "\n");
  fs::rename(out / "latest.tmp", out / "latest");
  fsync_dir(out);
  // Only now, with `latest` durable, may old checkpoints go.
  if (keep > 0) {
    std::vector<fs::path> all = complete_checkpoints(out);
    for (size_t i = 0; i + size_t(keep) < all.size(); ++i)
      if (all[i].filename() != final_dir.filename()) fs::remove_all(all[i]);
  }
  return final_dir.string();
}

std::vector<std::string> checkpoints_in(const std::string& run_dir) {
  std::vector<std::string> names;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return names;
  for (const fs::path& p : complete_checkpoints(run_dir)) names.push_back(p.filename().string());
  return names;
}

void clear_run_dir(const std::string& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return;
  const fs::path dir(run_dir);
  // `latest` first: from then on the directory names no checkpoint.
  for (const char* f : {"latest", "latest.tmp", "metrics.jsonl", "config.yaml"}) fs::remove(dir / f);
  fsync_dir(dir);
  std::vector<fs::path> ckpts;  // listed first: not removed while the directory is read
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().rfind("ckpt_", 0) == 0) ckpts.push_back(e.path());
  for (const fs::path& p : ckpts) fs::remove_all(p);
  fsync_dir(dir);
}

std::string resolve_checkpoint(const std::string& path) {
  fs::path p(path);
  while (!p.empty() && !p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  if (is_temporary(p))
    fail_input("'", path, "' is an incomplete checkpoint (its save was interrupted); use the run directory "
               "or a complete ckpt_* directory");
  std::error_code ec;  // a path the system cannot even look up (too long) is not a checkpoint either
  if (fs::exists(p / "model.bin", ec)) return p.string();
  if (fs::exists(p / "latest", ec)) {
    // One name of a complete checkpoint next to it: anything else (a path, a temporary
    // directory, a name that is not there) means the run directory is damaged.
    std::string name = read_file(p / "latest");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || is_temporary(name) ||
        !fs::is_directory(p / name, ec))
      fail_input("'", (p / "latest").string(), "' names '", name, "', which is not a complete checkpoint directory in '",
                 p.string(), "'");
    return (p / name).string();
  }
  fail_input("'", path, "' is neither a checkpoint directory (with model.bin) nor a run directory (with latest)");
}

void verify_checkpoint(const std::string& ckpt_dir) {
  verify_checksums(fs::path(ckpt_dir), {"model.bin", "config.yaml", "state.json"});
}

void load_model_weights(const std::string& ckpt_dir, GPT2& model) {
  fs::path dir(ckpt_dir);
  // Only what the weights need: the optimizer state (three times their size in fp32) is
  // not read just to be checked.
  verify_checksums(dir, {"model.bin", "config.yaml", "state.json"}, /*only_required=*/true);
  load_weights_file(dir, model);
}

namespace {

// optimizer.bin opened and checked against what `opt` expects, its tensor entries
// included (before any tensor is handed over, so before a multi-rank resume broadcasts
// anything). Each of its tensors holds model.num_packed() elements.
TensorFile open_optimizer_file(const fs::path& dir, const GPT2& model, const OptimizerSink& opt) {
  TensorFile file(dir / "optimizer.bin", kOptMagic);
  const std::string& what = file.what();
  const nlohmann::json& h = file.header();
  if (!h.contains("params"))
    fail_input(what, " was written by an older flashgpt (padded layout); its weights load, but it cannot be resumed");
  const size_t n = json_uint(h, "numel", what);
  const size_t es = dtype_size(opt.dtype), count = h.at("master").get<bool>() ? 3 : 2;
  if (n != model.num_packed() || h.at("dtype") != dtype_name(opt.dtype) || count != size_t(opt.count) ||
      n * es * count != file.data_bytes())
    fail_input(what, " does not fit this run (other precision or model) or is truncated");
  packed_offsets(model, file, n);
  return file;
}

}  // namespace

CheckpointState load_checkpoint(const std::string& ckpt_dir, GPT2& model, const OptimizerSink& opt) {
  fs::path dir(ckpt_dir);
  verify_checksums(dir, {"model.bin", "config.yaml", "state.json", "optimizer.bin"});
  load_weights_file(dir, model);
  try {
    const TensorFile file = open_optimizer_file(dir, model, opt);
    const auto s = parse_json((dir / "state.json").string(), read_file(dir / "state.json"));
    CheckpointState st;
    st.step = int(json_uint(s, "step", (dir / "state.json").string(), INT_MAX));
    st.loader = s.at("loader");
    st.extra = s.value("extra", nlohmann::json::object());
    st.optimizer_step = int(json_uint(file.header(), "step", file.what(), INT_MAX));
    return st;
  } catch (const nlohmann::json::exception& e) {
    fail_input("checkpoint '", dir.string(), "' has malformed state: ", e.what());
  }
}

void load_optimizer_state(const std::string& ckpt_dir, const GPT2& model, const OptimizerSink& opt) {
  fs::path dir(ckpt_dir);
  try {
    TensorFile file = open_optimizer_file(dir, model, opt);
    const size_t n = model.num_packed(), es = dtype_size(opt.dtype);
    for (int k = 0; k < opt.count; ++k) opt.store(k, unpack_params(model, file, size_t(k) * n * es, n, opt.dtype));
  } catch (const nlohmann::json::exception& e) {
    fail_input("checkpoint '", dir.string(), "' has malformed state: ", e.what());
  }
}

}  // namespace flashgpt

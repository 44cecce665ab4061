#include "train/checkpoint.h"
#include <algorithm>
#include <cstdio>
#include <map>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>
#include "src/errors.h"
#include "src/host_floats.h"

namespace fs = std::filesystem;

namespace flashgpt {
namespace {

constexpr char kModelMagic[8] = {'F', 'G', 'P', 'T', 'M', 'D', 'L', '1'};
constexpr char kOptMagic[8] = {'F', 'G', 'P', 'T', 'O', 'P', 'T', '1'};

uint64_t fnv1a(const std::string& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) { h ^= c; h *= 1099511628211ull; }
  return h;
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) fail_input("checkpoint file '", p.string(), "' is missing or unreadable");
  std::ostringstream os;
  os << f.rdbuf();
  return os.str();
}

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  f.flush();
  if (!f) fail("cannot write '", p.string(), "'");
}

std::string tensor_bytes(Ops& ops, const Tensor& t) {
  std::string s(t.nbytes(), '\0');
  ops.to_host(s.data(), t);
  return s;
}

// [magic 8][json length u64][json][raw tensors...]
std::string pack(const char magic[8], const nlohmann::json& header, const std::vector<std::string>& blobs) {
  std::string h = header.dump();
  uint64_t n = h.size();
  std::string out(magic, 8);
  out.append(reinterpret_cast<const char*>(&n), 8);
  out += h;
  for (const auto& b : blobs) out += b;
  return out;
}

nlohmann::json unpack(const std::string& bytes, const char magic[8], const std::string& what, size_t* data_offset) {
  if (bytes.size() < 16 || std::memcmp(bytes.data(), magic, 8) != 0)
    fail_input(what, " is not a flashgpt file (bad magic)");
  uint64_t n;
  std::memcpy(&n, bytes.data() + 8, 8);
  if (16 + n > bytes.size()) fail_input(what, " is truncated (header)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(bytes.substr(16, n));
  } catch (const nlohmann::json::exception&) {
    fail_input(what, " has a corrupt header");
  }
  *data_offset = 16 + n;
  return j;
}

void verify_checksums(const fs::path& dir) {
  nlohmann::json sums;
  try {
    sums = nlohmann::json::parse(read_file(dir / "checksums.json"));
  } catch (const nlohmann::json::exception&) {
    fail_input("checkpoint '", dir.string(), "': checksums.json is corrupt");
  }
  for (auto& [name, sum] : sums.items()) {
    if (fnv1a(read_file(dir / name)) != sum.get<uint64_t>())
      fail_input("checkpoint '", dir.string(), "': ", name, " does not match its checksum (corrupt or truncated)");
  }
}

DType dtype_from(const std::string& s, const std::string& what) {
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    if (s == dtype_name(d)) return d;
  fail_input(what, ": unknown dtype '", s, "'");
}

// Parameters in the packed order (no padding): from an arena-layout host buffer.
std::string pack_params(const GPT2& model, const std::string& arena, DType dtype) {
  const size_t es = dtype_size(dtype);
  std::string out;
  out.reserve(model.num_packed() * es);
  for (const ParamInfo& p : model.param_list()) out.append(arena, p.offset * es, size_t(p.numel()) * es);
  return out;
}

// The file's tensors (header "params": name, offset, shape of each, offsets in elements
// from `data`) into an arena-layout buffer of dtype `dst_dtype` for `model`.
std::string unpack_params(const GPT2& model, const nlohmann::json& entries, const char* data, size_t data_elems,
                          DType src_dtype, DType dst_dtype, const std::string& what) {
  const auto& list = model.param_list();
  if (!entries.is_array() || entries.size() != list.size())
    fail_input(what, " holds ", entries.is_array() ? entries.size() : 0, " tensors, this model has ", list.size());
  const size_t ses = dtype_size(src_dtype), des = dtype_size(dst_dtype);
  std::string raw(model.num_params() * des, '\0');  // padding stays zero
  for (size_t i = 0; i < list.size(); ++i) {
    const ParamInfo& p = list[i];
    const auto& e = entries[i];
    if (e.at("name") != p.name || e.at("shape") != nlohmann::json(p.shape))
      fail_input(what, ": tensor ", i, " is ", e.at("name").dump(), " ", e.at("shape").dump(), ", expected '", p.name,
                 "' ", nlohmann::json(p.shape).dump());
    const uint64_t off = e.at("offset").get<uint64_t>();
    if (off > data_elems || data_elems - off < uint64_t(p.numel()))
      fail_input(what, ": tensor '", p.name, "' lies outside the file (corrupt or truncated)");
    const char* src = data + off * ses;
    char* dst = raw.data() + p.offset * des;
    if (src_dtype == dst_dtype) std::memcpy(dst, src, size_t(p.numel()) * des);
    else doubles_to_raw(dst, dst_dtype, doubles_from_raw(src, src_dtype, size_t(p.numel())));  // e.g. bf16 run on the CPU
  }
  return raw;
}

nlohmann::json param_entries(const GPT2& model) {
  nlohmann::json names = nlohmann::json::array();
  for (const auto& p : model.param_list()) names.push_back({{"name", p.name}, {"offset", p.packed}, {"shape", p.shape}});
  return names;
}

void load_weights_file(const fs::path& dir, GPT2& model) {
  const std::string what = (dir / "model.bin").string();
  std::string bytes = read_file(dir / "model.bin");
  size_t off;
  auto h = unpack(bytes, kModelMagic, what, &off);
  const auto& c = model.config();
  try {
    if (h.at("n_layer") != c.n_layer || h.at("n_head") != c.n_head || h.at("n_embd") != c.n_embd ||
        h.at("vocab_size") != c.vocab_size || h.at("padded_vocab") != c.padded_vocab ||
        h.at("max_seq_len") != c.max_seq_len)
      fail_input("checkpoint '", dir.string(), "' was made for another model shape: ", h.dump());
    DType d = dtype_from(h.at("dtype").get<std::string>(), what);
    uint64_t n = h.at("numel").get<uint64_t>();
    if (n > (bytes.size() - off) / dtype_size(d) || off + n * dtype_size(d) != bytes.size())
      fail_input(what, " has the wrong size (corrupt or truncated)");
    std::string arena = unpack_params(model, h.at("params"), bytes.data() + off, n, d, model.dtype(), what);
    model.ops().from_host(model.params(), arena.data());
  } catch (const nlohmann::json::exception& e) {
    fail_input(what, " has a malformed header: ", e.what());
  }
}

}  // namespace

std::string checkpoint_config_path(const std::string& ckpt_dir) {
  return (fs::path(ckpt_dir) / "config.yaml").string();
}

std::string save_checkpoint(const std::string& out_dir, const GPT2& model, const OptimizerSnapshot* opt,
                            const CheckpointState& st, const std::string& config_yaml) {
  GPT2& m = const_cast<GPT2&>(model);
  Ops& ops = m.ops();
  char name[32];
  std::snprintf(name, sizeof name, "ckpt_%06d", st.step);
  fs::path final_dir = fs::path(out_dir) / name;
  fs::path tmp_dir = fs::path(out_dir) / (std::string(name) + ".tmp");
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);

  const auto& c = model.config();
  nlohmann::json mh = {{"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
                       {"vocab_size", c.vocab_size}, {"padded_vocab", c.padded_vocab},
                       {"max_seq_len", c.max_seq_len}, {"dtype", dtype_name(model.dtype())},
                       {"numel", model.num_packed()}, {"params", param_entries(model)}};
  std::map<std::string, std::string> files;
  files["model.bin"] = pack(kModelMagic, mh, {pack_params(model, tensor_bytes(ops, m.params()), model.dtype())});
  if (opt) {
    nlohmann::json oh = {{"step", opt->step}, {"dtype", dtype_name(opt->dtype)}, {"numel", model.num_packed()},
                         {"master", opt->tensors.size() == 3}, {"params", param_entries(model)}};
    std::vector<std::string> blobs;
    for (const std::string& t : opt->tensors) blobs.push_back(pack_params(model, t, opt->dtype));
    files["optimizer.bin"] = pack(kOptMagic, oh, blobs);
  }
  files["state.json"] = nlohmann::json{{"step", st.step}, {"loader", st.loader}, {"extra", st.extra}}.dump(1);
  files["config.yaml"] = config_yaml;
  nlohmann::json sums;
  for (auto& [fname, bytes] : files) {
    write_file(tmp_dir / fname, bytes);
    sums[fname] = fnv1a(bytes);
  }
  write_file(tmp_dir / "checksums.json", sums.dump(1));
  // Complete: move into place, then point `latest` at it (both renames are atomic).
  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);
  write_file(fs::path(out_dir) / "latest.tmp", std::string(name) + "\n");
  fs::rename(fs::path(out_dir) / "latest.tmp", fs::path(out_dir) / "latest");
  return final_dir.string();
}

std::string resolve_checkpoint(const std::string& path) {
  fs::path p(path);
  if (fs::exists(p / "model.bin")) return p.string();
  if (fs::exists(p / "latest")) {
    std::string name = read_file(p / "latest");
    while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
    return (p / name).string();
  }
  fail_input("'", path, "' is neither a checkpoint directory (with model.bin) nor a run directory (with latest)");
}

void load_model_weights(const std::string& ckpt_dir, GPT2& model) {
  fs::path dir(ckpt_dir);
  verify_checksums(dir);
  load_weights_file(dir, model);
}

CheckpointState load_checkpoint(const std::string& ckpt_dir, GPT2& model, OptimizerSnapshot* opt) {
  fs::path dir(ckpt_dir);
  verify_checksums(dir);
  load_weights_file(dir, model);
  const std::string what = (dir / "optimizer.bin").string();
  std::string bytes = read_file(dir / "optimizer.bin");
  size_t off;
  auto h = unpack(bytes, kOptMagic, what, &off);
  try {
    if (!h.contains("params"))
      fail_input(what, " was written by an older flashgpt (padded layout); its weights load, but it cannot be resumed");
    const size_t n = h.at("numel").get<uint64_t>(), es = dtype_size(opt->dtype);
    const size_t count = h.at("master").get<bool>() ? 3 : 2;
    if (n != model.num_packed() || h.at("dtype") != dtype_name(opt->dtype) || count != opt->tensors.size() ||
        off + n * es * count != bytes.size())
      fail_input(what, " does not fit this run (other precision or model) or is truncated");
    for (size_t k = 0; k < count; ++k)
      opt->tensors[k] = unpack_params(model, h.at("params"), bytes.data() + off + k * n * es, n, opt->dtype,
                                      opt->dtype, what);
    opt->step = h.at("step").get<int>();
    auto s = nlohmann::json::parse(read_file(dir / "state.json"));
    CheckpointState st;
    st.step = s.at("step").get<int>();
    st.loader = s.at("loader");
    st.extra = s.value("extra", nlohmann::json::object());
    return st;
  } catch (const nlohmann::json::exception& e) {
    fail_input("checkpoint '", dir.string(), "' has malformed state: ", e.what());
  }
}

OptimizerSnapshot snapshot_of(AdamW& opt) {
  FG_ASSERT(opt.owned().size() == 1 && opt.owned()[0].size() == opt.model().num_params(),
            "snapshot_of needs an optimizer that owns the whole arena");
  OptimizerSnapshot s{opt.steps_done(), opt.m().dtype, {}};
  for (Tensor t : {opt.m(), opt.v(), opt.master()})
    if (t.defined()) s.tensors.push_back(tensor_bytes(opt.model().ops(), t));
  return s;
}

void restore_from(AdamW& opt, const OptimizerSnapshot& snap) {
  FG_ASSERT(opt.owned().size() == 1 && opt.owned()[0].size() == opt.model().num_params(),
            "restore_from needs an optimizer that owns the whole arena");
  size_t k = 0;
  for (Tensor t : {opt.m(), opt.v(), opt.master()})
    if (t.defined()) opt.model().ops().from_host(t, snap.tensors.at(k++).data());
  opt.set_steps_done(snap.step);
}

}  // namespace flashgpt

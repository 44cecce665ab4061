#include "train/checkpoint.h"
#include <cstdio>
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

// Fills `t` (any float dtype) from raw `src` bytes of dtype `src_dtype`.
void upload_converted(Ops& ops, const Tensor& t, const char* src, DType src_dtype) {
  if (src_dtype == t.dtype) { ops.from_host(t, src); return; }
  // Different precision (e.g. a bf16 run evaluated on the CPU): convert on the host.
  std::string raw(t.nbytes(), '\0');
  doubles_to_raw(raw.data(), t.dtype, doubles_from_raw(src, src_dtype, size_t(t.numel())));
  ops.from_host(t, raw.data());
}

DType dtype_from(const std::string& s, const std::string& what) {
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    if (s == dtype_name(d)) return d;
  fail_input(what, ": unknown dtype '", s, "'");
}

void load_weights_file(const fs::path& dir, GPT2& model) {
  std::string bytes = read_file(dir / "model.bin");
  size_t off;
  auto h = unpack(bytes, kModelMagic, (dir / "model.bin").string(), &off);
  const auto& c = model.config();
  if (h.at("n_layer") != c.n_layer || h.at("n_head") != c.n_head || h.at("n_embd") != c.n_embd ||
      h.at("padded_vocab") != c.padded_vocab || h.at("max_seq_len") != c.max_seq_len)
    fail_input("checkpoint '", dir.string(), "' was made for another model shape: ", h.dump());
  DType d = dtype_from(h.at("dtype").get<std::string>(), (dir / "model.bin").string());
  uint64_t n = h.at("numel").get<uint64_t>();
  if (n != model.num_params() || off + n * dtype_size(d) != bytes.size())
    fail_input((dir / "model.bin").string(), " has the wrong size (corrupt or truncated)");
  upload_converted(model.ops(), model.params(), bytes.data() + off, d);
}

}  // namespace

std::string checkpoint_config_path(const std::string& ckpt_dir) {
  return (fs::path(ckpt_dir) / "config.yaml").string();
}

std::string save_checkpoint(const std::string& out_dir, const GPT2& model, const AdamW* opt,
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
                       {"numel", model.num_params()}};
  nlohmann::json names = nlohmann::json::array();
  for (const auto& p : model.param_list()) names.push_back({{"name", p.name}, {"offset", p.offset}, {"shape", p.shape}});
  mh["params"] = names;
  std::map<std::string, std::string> files;
  files["model.bin"] = pack(kModelMagic, mh, {tensor_bytes(ops, m.params())});
  if (opt) {
    nlohmann::json oh = {{"step", opt->steps_done()}, {"dtype", dtype_name(opt->m().dtype)},
                         {"numel", model.num_params()}, {"master", opt->master().defined()}};
    std::vector<std::string> blobs = {tensor_bytes(ops, opt->m()), tensor_bytes(ops, opt->v())};
    if (opt->master().defined()) blobs.push_back(tensor_bytes(ops, opt->master()));
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

CheckpointState load_checkpoint(const std::string& ckpt_dir, GPT2& model, AdamW& opt) {
  fs::path dir(ckpt_dir);
  verify_checksums(dir);
  load_weights_file(dir, model);
  std::string bytes = read_file(dir / "optimizer.bin");
  size_t off;
  auto h = unpack(bytes, kOptMagic, (dir / "optimizer.bin").string(), &off);
  const size_t n = model.num_params();
  const size_t es = dtype_size(opt.m().dtype);
  const bool master = h.at("master").get<bool>();
  if (h.at("numel").get<uint64_t>() != n || h.at("dtype") != dtype_name(opt.m().dtype) ||
      master != opt.master().defined() || off + n * es * (master ? 3 : 2) != bytes.size())
    fail_input((dir / "optimizer.bin").string(), " does not fit this run (other precision or model) or is truncated");
  Ops& ops = model.ops();
  ops.from_host(opt.m(), bytes.data() + off);
  ops.from_host(opt.v(), bytes.data() + off + n * es);
  if (master) ops.from_host(opt.master(), bytes.data() + off + 2 * n * es);
  opt.set_steps_done(h.at("step").get<int>());
  auto s = nlohmann::json::parse(read_file(dir / "state.json"));
  CheckpointState st;
  st.step = s.at("step").get<int>();
  st.loader = s.at("loader");
  st.extra = s.value("extra", nlohmann::json::object());
  return st;
}

}  // namespace flashgpt

#include "train/hf_interop.h"
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <nlohmann/json.hpp>
#include "data/tokenizer.h"
#include "layers/gpt2.h"
#include "src/commands.h"
#include "src/errors.h"
#include "src/json_fields.h"
#include "src/host_floats.h"
#include "train/checkpoint.h"
#include "train/load_model.h"
#include "train/safetensors.h"

namespace fs = std::filesystem;

namespace flashgpt {
namespace {

constexpr int kVocabRowMultiple = 128;  // padded_vocab of an imported model: rows of wte for fast matmuls
constexpr double kLayerNormEps = 1e-5;  // flashgpt's layernorm epsilon (kernels/ops.h)
constexpr uint64_t kTensorsPerLayer = 12;  // GPT-2's block: 2 layernorms, 4 matmuls, their 12 weights and biases

// HF GPT-2 name of a flashgpt parameter, without the "transformer." prefix.
std::string hf_name(const std::string& name) {
  return name == "wte" || name == "wpe" ? name + ".weight" : name;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The four matmul weights of a block: Conv1D (in, out) in HF, nn.Linear (out, in) here.
bool is_conv1d(const std::string& name) {
  for (const char* s : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (ends_with(name, s)) return true;
  return false;
}

// (rows, cols) row-major -> (cols, rows) row-major.
std::vector<double> transpose(const std::vector<double>& a, int64_t rows, int64_t cols) {
  std::vector<double> t(a.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = a[size_t(r * cols + c)];
  return t;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "(";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ")";
  return os.str();
}

std::vector<unsigned char> encode_values(const std::vector<double>& v, const std::string& dtype) {
  const size_t es = safetensors::dtype_bytes(dtype);
  std::vector<unsigned char> out(v.size() * es);
  const DType d = dtype == "F64" ? DType::f64 : dtype == "F32" ? DType::f32 : DType::bf16;
  doubles_to_raw(out.data(), d, v);  // little-endian hosts only (x86-64, aarch64)
  return out;
}

// ---- export ------------------------------------------------------------------------

nlohmann::json hf_config(const ModelConfig& c, const std::string& torch_dtype) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_positions", c.max_seq_len},
          {"n_ctx", c.max_seq_len},
          {"n_embd", c.n_embd},
          {"n_layer", c.n_layer},
          {"n_head", c.n_head},
          {"n_inner", nullptr},
          {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", kLayerNormEps},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"initializer_range", 0.02},
          {"scale_attn_weights", true},
          {"scale_attn_by_inverse_layer_idx", false},
          {"reorder_and_upcast_attn", false},
          {"tie_word_embeddings", true},
          {"use_cache", true},
          {"bos_token_id", c.vocab_size - 1},
          {"eos_token_id", c.vocab_size - 1},
          {"torch_dtype", torch_dtype}};
}

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
  f.flush();
  if (!f) fail("cannot write '", p.string(), "'");
}

// ---- import ------------------------------------------------------------------------

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  if (!f) fail_input(p.string(), ": missing or unreadable");
  try {
    return parse_json(p.string(), f);
  } catch (const nlohmann::json::exception& e) {
    fail_input(p.string(), ": not valid JSON (", e.what(), ")");
  }
}

int config_int(const nlohmann::json& j, const fs::path& file, const std::string& key, const char* fallback = nullptr) {
  const nlohmann::json* v = j.contains(key) ? &j[key] : (fallback && j.contains(fallback) ? &j[fallback] : nullptr);
  if (!v) fail_input(file.string(), ": missing key '", key, "'");
  if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > (1 << 30))
    fail_input(file.string(), ": '", key, "' must be a positive integer, got ", v->dump());
  return v->get<int>();
}

// Checks the GPT-2 variants flashgpt does not implement are not asked for.
void check_supported(const nlohmann::json& j, const fs::path& file, int n_embd) {
  auto setting = [&](const char* key, const nlohmann::json& expected, const char* why) {
    if (j.contains(key) && !j[key].is_null() && j[key] != expected)
      fail_input(file.string(), ": '", key, "' is ", j[key].dump(), "; flashgpt supports only ", expected.dump(), " (", why, ")");
  };
  if (j.contains("model_type") && j["model_type"] != "gpt2")
    fail_input(file.string(), ": model_type is ", j["model_type"].dump(), ", not \"gpt2\"");
  if (j.contains("activation_function") && j["activation_function"] != "gelu_new" &&
      j["activation_function"] != "gelu_pytorch_tanh")
    fail_input(file.string(), ": activation_function is ", j["activation_function"].dump(),
               "; flashgpt's GELU is the tanh approximation (gelu_new)");
  if (j.contains("layer_norm_epsilon") && (!j["layer_norm_epsilon"].is_number() || j["layer_norm_epsilon"].get<double>() != kLayerNormEps))
    fail_input(file.string(), ": layer_norm_epsilon is ", j["layer_norm_epsilon"].dump(), "; flashgpt uses 1e-05");
  if (j.contains("n_inner") && !j["n_inner"].is_null() && j["n_inner"] != 4 * n_embd)
    fail_input(file.string(), ": n_inner is ", j["n_inner"].dump(), "; flashgpt's MLP is 4·n_embd = ", 4 * n_embd);
  setting("tie_word_embeddings", true, "the LM head is wte");
  setting("scale_attn_weights", true, "scores are scaled by 1/sqrt(head dim)");
  setting("scale_attn_by_inverse_layer_idx", false, "no per-layer score scaling");
  setting("reorder_and_upcast_attn", false, "");
  setting("add_cross_attention", false, "decoder only");
}

// A model's tensors, in one file or sharded (model.safetensors.index.json).
struct HfWeights {
  std::vector<std::unique_ptr<safetensors::File>> files;
  std::map<std::string, std::pair<const safetensors::File*, const safetensors::TensorInfo*>> tensors;

  explicit HfWeights(const fs::path& dir) {
    const fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    std::vector<fs::path> paths;
    if (fs::exists(single)) {
      paths.push_back(single);
    } else if (fs::exists(index)) {
      const nlohmann::json j = read_json(index);
      if (!j.contains("weight_map") || !j["weight_map"].is_object())
        fail_input(index.string(), ": no weight_map object");
      std::set<std::string> names;
      for (auto& [k, v] : j["weight_map"].items()) {
        if (!v.is_string() || v.get<std::string>().find('/') != std::string::npos)
          fail_input(index.string(), ": weight_map entry '", k, "' is not a file name in the directory");
        names.insert(v.get<std::string>());
      }
      for (const auto& n : names) paths.push_back(dir / n);
    } else {
      fail_input(dir.string(), ": no model.safetensors (nor model.safetensors.index.json); flashgpt imports safetensors "
                 "weights only (transformers: model.save_pretrained(dir) writes them)");
    }
    for (const auto& p : paths) {
      files.push_back(std::make_unique<safetensors::File>(p.string()));
      for (const auto& t : files.back()->tensors()) {
        if (tensors.count(t.name)) fail_input(p.string(), ": tensor '", t.name, "' is also in another shard");
        tensors[t.name] = {files.back().get(), &t};
      }
    }
  }
};

}  // namespace

void export_hf(const ExportOptions& o) {
  static const std::map<std::string, std::string> kDtypes = {{"f32", "F32"}, {"bf16", "BF16"}, {"f64", "F64"}};
  if (!kDtypes.count(o.dtype)) fail_input("--dtype must be f32, bf16 or f64, got '", o.dtype, "'");
  const std::string st_dtype = kDtypes.at(o.dtype);
  // Weights in fp64 for an F64 export, else fp32 (exact for fp32 and bf16 checkpoints).
  LoadedModel lm = load_for_inference(o.checkpoint, "cpu", o.dtype == "f64" ? "fp64" : "fp32", 1, 1);
  const GPT2& model = *lm.model;
  const ModelConfig& c = model.config();
  // GPT-2 has a learned position table; transformers would load a RoPE model's export
  // with a random one (a warning, then garbage), so it is refused here.
  if (c.position != PositionEncoding::learned)
    fail_input("export --hf writes GPT-2, which has learned positions; '", o.checkpoint,
               "' uses rotary positions (model.position: rope), which GPT-2 cannot express");

  std::vector<safetensors::OutTensor> out;
  for (const ParamInfo& p : model.param_list()) {
    std::vector<int64_t> shape = p.shape;
    if (p.name == "wte") shape[0] = c.vocab_size;  // padded rows dropped
    if (is_conv1d(p.name)) std::swap(shape[0], shape[1]);
    out.push_back({"transformer." + hf_name(p.name), st_dtype, shape});
  }
  create_output_dir(o.out_dir, "--hf");
  const fs::path dir(o.out_dir);
  safetensors::write((dir / "model.safetensors").string(), out, {{"format", "pt"}}, [&](size_t i) {
    const ParamInfo& p = model.param_list()[i];
    Tensor t = model.param(p);
    std::vector<char> raw(t.nbytes());
    lm.backend.ops->to_host(raw.data(), t);
    std::vector<double> v = doubles_from_raw(raw.data(), t.dtype, size_t(t.numel()));
    if (p.name == "wte") v.resize(size_t(c.vocab_size) * size_t(c.n_embd));
    if (is_conv1d(p.name)) v = transpose(v, p.shape[0], p.shape[1]);
    return encode_values(v, st_dtype);
  });
  const char* torch_dtype = o.dtype == "f64" ? "float64" : o.dtype == "bf16" ? "bfloat16" : "float32";
  write_text(dir / "config.json", hf_config(c, torch_dtype).dump(2) + "\n");
  // The tokenizer, so that AutoTokenizer.from_pretrained(OUT_DIR) works too: GPT-2's
  // encoder.json and vocab.bpe are HF's vocab.json and merges.txt.
  const fs::path vocab = o.vocab.empty() ? fs::path(Tokenizer::default_dir()) : fs::path(o.vocab);
  bool tokenizer = false;
  if (c.vocab_size == 50257 && fs::exists(vocab / "encoder.json") && fs::exists(vocab / "vocab.bpe")) {
    fs::copy_file(vocab / "encoder.json", dir / "vocab.json", fs::copy_options::overwrite_existing);
    fs::copy_file(vocab / "vocab.bpe", dir / "merges.txt", fs::copy_options::overwrite_existing);
    write_text(dir / "tokenizer_config.json",
               nlohmann::json{{"tokenizer_class", "GPT2Tokenizer"}, {"model_max_length", c.max_seq_len},
                              {"bos_token", "<|endoftext|>"}, {"eos_token", "<|endoftext|>"},
                              {"unk_token", "<|endoftext|>"}, {"add_prefix_space", false}}.dump(2) + "\n");
    tokenizer = true;
  }
  size_t n = 0;
  for (const auto& t : out) { size_t k = 1; for (auto s : t.shape) k *= size_t(s); n += k; }
  std::printf("export: %s -> %s (model.safetensors: %zu tensors, %.2fM parameters, %s; config.json%s)\n",
              lm.dir.c_str(), o.out_dir.c_str(), out.size(), double(n) / 1e6, st_dtype.c_str(),
              tokenizer ? "; vocab.json, merges.txt" : "");
}

std::string import_hf(const ImportOptions& o) {
  // Its ckpt_000000 would mix with (or replace) another run's checkpoints.
  if (const std::vector<std::string> old = checkpoints_in(o.out_dir); !old.empty())
    fail_input("--out '", o.out_dir, "' already holds checkpoints (newest ", old.back(),
               "): import into a new directory");
  const fs::path dir(o.hf_dir), cfg_path = dir / "config.json";
  const nlohmann::json j = read_json(cfg_path);
  if (!j.is_object()) fail_input(cfg_path.string(), ": not a JSON object");
  ModelConfig mc;
  mc.n_layer = config_int(j, cfg_path, "n_layer");
  mc.n_head = config_int(j, cfg_path, "n_head");
  mc.n_embd = config_int(j, cfg_path, "n_embd");
  mc.vocab_size = config_int(j, cfg_path, "vocab_size");
  mc.max_seq_len = config_int(j, cfg_path, "n_positions", "n_ctx");
  mc.padded_vocab = (mc.vocab_size + kVocabRowMultiple - 1) / kVocabRowMultiple * kVocabRowMultiple;
  if (mc.n_embd % mc.n_head != 0)
    fail_input(cfg_path.string(), ": n_embd ", mc.n_embd, " is not divisible by n_head ", mc.n_head);
  check_supported(j, cfg_path, mc.n_embd);

  HfWeights hf(dir);
  const std::string prefix = hf.tensors.count("transformer.wte.weight") ? "transformer." : "";
  // Checkpoint precision: the weights' own if they agree (F32, F64, BF16), else fp32
  // (fp64 if any is F64); F16 values are exact in fp32.
  std::set<std::string> dtypes;
  for (const auto& [name, t] : hf.tensors) dtypes.insert(t.second->dtype);

  Config cfg;
  set_model_config(cfg, mc);
  cfg.train.seq_len = mc.max_seq_len;
  cfg.run.out_dir = o.out_dir;
  validate_config(cfg);

  DType dtype = DType::f32;
  if (dtypes.count("F64")) dtype = DType::f64;
  else if (dtypes.size() == 1 && *dtypes.begin() == "BF16") dtype = DType::bf16;

  // Every tensor is checked against config.json before the model is allocated: a wrong
  // config.json (n_layer 1200 for 12) is named, not allocated. Listing the model's
  // tensors takes time and memory in n_layer, so the file bounds n_layer first.
  if (uint64_t(mc.n_layer) * kTensorsPerLayer > hf.tensors.size())
    fail_input(cfg_path.string(), ": n_layer is ", mc.n_layer, ", but the weights hold ", hf.tensors.size(),
               " tensors, and GPT-2 has ", kTensorsPerLayer, " per layer");
  ModelOptions inference;
  inference.gradients = false;  // a checkpoint holds weights only
  std::set<std::string> used;
  // The file's tensor for each parameter, in the model's order.
  std::vector<std::pair<const safetensors::File*, const safetensors::TensorInfo*>> sources;
  for (const ParamInfo& p : GPT2::memory(mc, Device::cpu, dtype, 1, 1, inference).params) {
    const std::string name = prefix + hf_name(p.name);
    auto it = hf.tensors.find(name);
    if (it == hf.tensors.end()) fail_input(dir.string(), ": the weights have no tensor '", name, "'");
    const safetensors::TensorInfo& t = *it->second.second;
    std::vector<int64_t> want = p.shape;
    if (p.name == "wte") want[0] = mc.vocab_size;
    if (is_conv1d(p.name)) std::swap(want[0], want[1]);
    if (t.shape != want)
      fail_input(it->second.first->path(), ": tensor '", name, "' has shape ", shape_text(t.shape), "; config.json implies ",
                 shape_text(want));
    used.insert(name);
    sources.push_back(it->second);
  }
  for (const auto& [name, t] : hf.tensors) {
    if (used.count(name)) continue;
    if (ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias")) continue;  // attention-mask buffers
    if (name == "lm_head.weight") {  // tied to wte: accepted when it is the same matrix
      const auto& w = hf.tensors.at(prefix + "wte.weight");
      if (t.second->shape != w.second->shape || t.first->to_doubles(*t.second) != w.first->to_doubles(*w.second))
        fail_input(t.first->path(), ": lm_head.weight differs from wte; flashgpt's LM head is tied to wte");
      continue;
    }
    fail_input(t.first->path(), ": unexpected tensor '", name, "' (not part of GPT-2)");
  }

  auto ops = make_cpu_ops();
  GPT2 model(mc, *ops, dtype, 1, 1, inference);
  FG_ASSERT(model.param_list().size() == sources.size(), "the planned and the built model differ");
  for (size_t i = 0; i < sources.size(); ++i) {
    const ParamInfo& p = model.param_list()[i];
    const auto [file, t] = sources[i];
    std::vector<double> v;
    v.reserve(size_t(p.numel()));  // wte's padded rows (zero) without a second copy of the table
    file->to_doubles(*t, v);
    if (is_conv1d(p.name)) v = transpose(v, t->shape[0], t->shape[1]);
    v.resize(size_t(p.numel()), 0.0);
    const Tensor dst = model.param(p);
    std::vector<char> raw(dst.nbytes());
    doubles_to_raw(raw.data(), dtype, v);
    ops->from_host(dst, raw.data());
  }

  create_output_dir(o.out_dir, "--out");
  CheckpointState st;
  st.extra = {{"imported_from", fs::absolute(dir).string()}};
  const std::string written = save_checkpoint(o.out_dir, model, nullptr, st, config_to_yaml(cfg));
  std::printf("import: GPT-2 with %d layers, %d heads, n_embd %d, vocabulary %d, context %d: %.2fM parameters (%s) -> %s\n",
              mc.n_layer, mc.n_head, mc.n_embd, mc.vocab_size, mc.max_seq_len,
              double(model.num_params()) / 1e6, dtype_name(dtype), written.c_str());
  return written;
}

void add_interop_commands(CLI::App& app) {
  auto e = std::make_shared<ExportOptions>();
  auto* ex = app.add_subcommand("export", "Write a checkpoint as a Hugging Face GPT-2 (model.safetensors + config.json)");
  ex->add_option("checkpoint", e->checkpoint, "Checkpoint directory, or a run directory (uses its latest)")->required();
  ex->add_option("--hf", e->out_dir, "Output directory for transformers.GPT2LMHeadModel.from_pretrained")->required();
  ex->add_option("--dtype", e->dtype, "Weights' dtype in the file: f32 | bf16 | f64")->capture_default_str();
  ex->add_option("--vocab", e->vocab, "Tokenizer directory copied as vocab.json/merges.txt (default: cache/gpt2)");
  ex->callback([e] { export_hf(*e); });

  auto i = std::make_shared<ImportOptions>();
  auto* im = app.add_subcommand("import", "Read a Hugging Face GPT-2 (model.safetensors + config.json) into a checkpoint");
  im->add_option("hf_dir", i->hf_dir, "Directory with config.json and model.safetensors")->required();
  im->add_option("--out", i->out_dir, "Run directory to write (checkpoint ckpt_000000 and latest)")->required();
  im->callback([i] { import_hf(*i); });
}

}  // namespace flashgpt

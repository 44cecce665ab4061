// Hugging Face interop, sampling and raw-text evaluation through the flashgpt program:
// export → import is bit-exact; the export read back by an independent minimal
// safetensors reader (below) holds HF's names, Conv1D layout and no padded rows;
// malformed safetensors files and configs are rejected with exit code 2; `sample` is
// deterministic for a seed; `eval --text` scores every token once with the documented
// sliding-window contexts; `train --init-from` starts from a checkpoint's weights.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <nlohmann/json.hpp>
#include "data/tokenizer.h"
#include "layers/gpt2.h"
#include "layers/gpt2_infer.h"
#include "src/config.h"
#include "tests/testing.h"
#include "tests/vocab.h"
#include "train/checkpoint.h"
#include "train/eval_text.h"
#include "train/load_model.h"

namespace fs = std::filesystem;

namespace flashgpt {
namespace {

using test::vocab_dir;

struct CliRun { int code; std::string out; };

// Runs the flashgpt program with `args` (shell words); stdout, and stderr unless dropped.
CliRun flashgpt(const std::string& args, bool with_stderr = true) {
  const std::string cmd = std::string(test::flashgpt_binary()) + " " + args + (with_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

Config config_for(const ModelConfig& m) {
  Config c;
  set_model_config(c, m);
  c.train.seq_len = std::min(c.train.seq_len, m.max_seq_len);
  c.train.precision = "fp32";
  return c;
}

// A checkpoint of a randomly initialised model (weights perturbed so that every tensor,
// biases and layernorms included, is non-trivial); returns its directory.
std::string make_checkpoint(const std::string& run_dir, const ModelConfig& m, DType dtype, uint64_t seed) {
  auto ops = make_cpu_ops();
  GPT2 model(m, *ops, dtype, 1, 1);
  model.init_random(seed);
  std::vector<double> p(model.num_params());
  std::vector<char> raw(model.params().nbytes());
  ops->to_host(raw.data(), model.params());
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = dtype == DType::f64 ? reinterpret_cast<double*>(raw.data())[i] : reinterpret_cast<float*>(raw.data())[i];
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0, 0.3);
  for (const auto& info : model.param_list()) {
    const int64_t limit = info.name == "wte" ? int64_t(m.vocab_size) * m.n_embd : info.numel();
    for (int64_t i = 0; i < limit; ++i) p[info.offset + size_t(i)] += n(rng);
  }
  for (size_t i = 0; i < p.size(); ++i) {
    if (dtype == DType::f64) reinterpret_cast<double*>(raw.data())[i] = p[i];
    else reinterpret_cast<float*>(raw.data())[i] = float(p[i]);
  }
  ops->from_host(model.params(), raw.data());
  Config c = config_for(m);
  c.train.precision = dtype == DType::f64 ? "fp64" : "fp32";
  return save_checkpoint(run_dir, model, nullptr, CheckpointState{}, config_to_yaml(c));
}

// Every parameter of a checkpoint, loaded in its own precision, as raw bytes.
std::vector<char> weights_of(const std::string& ckpt, const ModelConfig& m, DType dtype) {
  auto ops = make_cpu_ops();
  GPT2 model(m, *ops, dtype, 1, 1);
  load_model_weights(resolve_checkpoint(ckpt), model);
  std::vector<char> raw(model.params().nbytes());
  ops->to_host(raw.data(), model.params());
  return raw;
}

const ModelConfig kSmall = {2, 2, 16, 100, 128, 32};  // L, H, C, V, Vp, max T

TEST(Interop, ExportImportRoundTripIsBitExact) {
  test::ScratchDir dir("fg_roundtrip_");
  for (DType dtype : {DType::f32, DType::f64}) {
    const std::string tag = dtype_name(dtype);
    const std::string ckpt = make_checkpoint(dir.file("run_" + tag), kSmall, dtype, 11);
    const std::string dt = dtype == DType::f64 ? "f64" : "f32";
    CliRun e = flashgpt("export " + ckpt + " --hf " + dir.file("hf_" + tag) + " --dtype " + dt);
    ASSERT_EQ(e.code, 0) << e.out;
    CliRun i = flashgpt("import " + dir.file("hf_" + tag) + " --out " + dir.file("back_" + tag));
    ASSERT_EQ(i.code, 0) << i.out;
    const std::vector<char> a = weights_of(ckpt, kSmall, dtype), b = weights_of(dir.file("back_" + tag), kSmall, dtype);
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << tag << ": weights differ after export and import";
    const Config back = load_checkpoint_config(resolve_checkpoint(dir.file("back_" + tag)));
    EXPECT_EQ(back.model.n_layer, kSmall.n_layer);
    EXPECT_EQ(back.model.n_embd, kSmall.n_embd);
    EXPECT_EQ(back.model.vocab_size, kSmall.vocab_size);
    EXPECT_EQ(back.model.padded_vocab, kSmall.padded_vocab);
    EXPECT_EQ(back.model.max_seq_len, kSmall.max_seq_len);
  }
}

// An import never lands beside another run's checkpoints (it would mix with them, or
// replace their ckpt_000000). Exit 2, the directory untouched.
TEST(Interop, ImportRefusesADirectoryWithCheckpoints) {
  test::ScratchDir dir("fg_import_twice_");
  const std::string ckpt = make_checkpoint(dir.file("run"), kSmall, DType::f32, 13);
  ASSERT_EQ(flashgpt("export " + ckpt + " --hf " + dir.file("hf")).code, 0);
  ASSERT_EQ(flashgpt("import " + dir.file("hf") + " --out " + dir.file("back")).code, 0);
  const CliRun again = flashgpt("import " + dir.file("hf") + " --out " + dir.file("back"));
  EXPECT_EQ(again.code, 2) << again.out;
  EXPECT_NE(again.out.find("already holds checkpoints"), std::string::npos) << again.out;
  EXPECT_EQ(flashgpt("import " + dir.file("hf") + " --out " + dir.file("run")).code, 2) << "nor into a training run";
}

// GPT-2 has a position table, so a model with rotary positions has no GPT-2 export:
// refused with exit 2 before anything is written (transformers would load it with a
// random table and say so only in a warning).
TEST(Interop, ExportRefusesRotaryPositions) {
  test::ScratchDir dir("fg_export_rope_");
  ModelConfig rope = kSmall;
  rope.position = PositionEncoding::rope;
  const std::string ckpt = make_checkpoint(dir.file("run"), rope, DType::f32, 12);
  const CliRun e = flashgpt("export " + ckpt + " --hf " + dir.file("hf"));
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("rotary positions"), std::string::npos) << e.out;
  EXPECT_FALSE(fs::exists(dir.file("hf"))) << "nothing is written";
}

// ---- an independent minimal safetensors reader (the format's spec, nothing shared) ----
struct StTensor { std::string dtype; std::vector<int64_t> shape; std::vector<float> f32; };

std::map<std::string, StTensor> read_safetensors_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  std::map<std::string, StTensor> out;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    StTensor t{v["dtype"], v["shape"].get<std::vector<int64_t>>(), {}};
    const uint64_t b = v["data_offsets"][0], e = v["data_offsets"][1];
    t.f32.resize((e - b) / 4);
    std::memcpy(t.f32.data(), bytes.data() + 8 + n + b, e - b);
    out[name] = t;
  }
  return out;
}

TEST(Interop, ExportHasHfNamesConv1dLayoutAndNoPaddingRows) {
  test::ScratchDir dir("fg_export_");
  const std::string ckpt = make_checkpoint(dir.file("run"), kSmall, DType::f32, 5);
  CliRun e = flashgpt("export " + ckpt + " --hf " + dir.file("hf"));
  ASSERT_EQ(e.code, 0) << e.out;
  const auto st = read_safetensors_f32(dir.file("hf/model.safetensors"));
  auto ops = make_cpu_ops();
  GPT2 model(kSmall, *ops, DType::f32, 1, 1);
  load_model_weights(ckpt, model);
  std::vector<float> p(model.num_params());
  ops->to_host(p.data(), model.params());
  const int64_t C = kSmall.n_embd;
  EXPECT_EQ(st.size(), model.param_list().size()) << "one tensor per parameter, no lm_head.weight (tied)";
  for (const ParamInfo& info : model.param_list()) {
    const std::string name = "transformer." + (info.name == "wte" || info.name == "wpe" ? info.name + ".weight" : info.name);
    ASSERT_TRUE(st.count(name)) << name;
    const StTensor& t = st.at(name);
    EXPECT_EQ(t.dtype, "F32") << name;
    const float* ours = p.data() + info.offset;
    if (info.shape.size() == 1) {
      ASSERT_EQ(t.shape, info.shape) << name;
      for (int64_t i = 0; i < info.numel(); ++i) ASSERT_EQ(t.f32[size_t(i)], ours[i]) << name << "[" << i << "]";
    } else if (info.name == "wte" || info.name == "wpe") {  // (rows, C), wte without its padded rows
      const int64_t rows = info.name == "wte" ? kSmall.vocab_size : info.shape[0];
      ASSERT_EQ(t.shape, (std::vector<int64_t>{rows, C})) << name;
      for (int64_t i = 0; i < rows * C; ++i) ASSERT_EQ(t.f32[size_t(i)], ours[i]) << name << "[" << i << "]";
    } else {  // Conv1D: HF (in, out)[i][o] = ours (out, in)[o][i]
      const int64_t out = info.shape[0], in = info.shape[1];
      ASSERT_EQ(t.shape, (std::vector<int64_t>{in, out})) << name;
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) ASSERT_EQ(t.f32[size_t(i * out + o)], ours[o * in + i]) << name;
    }
  }
  std::ifstream cf(dir.file("hf/config.json"));
  const auto cfg = nlohmann::json::parse(cf);
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(cfg["n_layer"], kSmall.n_layer);
  EXPECT_EQ(cfg["n_head"], kSmall.n_head);
  EXPECT_EQ(cfg["n_embd"], kSmall.n_embd);
  EXPECT_EQ(cfg["vocab_size"], kSmall.vocab_size);
  EXPECT_EQ(cfg["n_positions"], kSmall.max_seq_len);
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
}

// ---- malformed inputs --------------------------------------------------------------
std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
void write_all(const std::string& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
}
std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(v >> (8 * i));
  return s;
}

class MalformedImport : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string ckpt = make_checkpoint(dir_.file("run"), kSmall, DType::f32, 2);
    CliRun e = flashgpt("export " + ckpt + " --hf " + dir_.file("good"));
    ASSERT_EQ(e.code, 0) << e.out;
    const std::string file = read_all(dir_.file("good/model.safetensors"));
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(file[size_t(i)]);
    header_ = nlohmann::json::parse(file.substr(8, n));
    data_ = file.substr(8 + n);
    config_ = read_all(dir_.file("good/config.json"));
  }
  // Imports a directory holding `config` and a safetensors file made of `raw` bytes;
  // expects exit code 2 and `expected` in the message.
  void expect_rejected(const std::string& raw, const std::string& expected, const std::string& config = "") {
    const std::string d = dir_.file("bad" + std::to_string(++cases_));
    fs::create_directories(d);
    write_all(d + "/model.safetensors", raw);
    write_all(d + "/config.json", config.empty() ? config_ : config);
    CliRun r = flashgpt("import " + d + " --out " + dir_.file("out"));
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find(expected), std::string::npos) << "expected '" << expected << "' in: " << r.out;
    EXPECT_EQ(r.out.find("fatal"), std::string::npos) << r.out;
    EXPECT_FALSE(fs::exists(dir_.file("out/latest"))) << "nothing may be written for bad input";
  }
  std::string file_with(const nlohmann::json& header, const std::string& data) {
    const std::string h = header.dump();
    return u64le(h.size()) + h + data;
  }
  test::ScratchDir dir_{"fg_malformed_"};
  nlohmann::json header_;
  std::string data_, config_;
  int cases_ = 0;
};

TEST_F(MalformedImport, TheUntouchedExportImports) {
  CliRun r = flashgpt("import " + dir_.file("good") + " --out " + dir_.file("ok"));
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST_F(MalformedImport, OffsetsPastTheEnd) {
  nlohmann::json h = header_;
  h["transformer.ln_f.bias"]["data_offsets"][1] = data_.size() + 64;
  expect_rejected(file_with(h, data_), "run past the end of the data");
  expect_rejected(file_with(header_, data_.substr(0, data_.size() - 4)), "run past the end of the data");  // truncated
}

TEST_F(MalformedImport, WrongDtype) {
  nlohmann::json h = header_;
  const std::string name = "transformer.h.0.ln_1.weight";
  const uint64_t b = h[name]["data_offsets"][0];
  h[name]["dtype"] = "I32";  // same size, so the file is well-formed: GPT-2's loader refuses it
  expect_rejected(file_with(h, data_), "has dtype I32");
  h[name]["dtype"] = "Q4";
  expect_rejected(file_with(h, data_), "unknown dtype 'Q4'");
  h[name]["dtype"] = "F64";  // twice the bytes its offsets hold
  expect_rejected(file_with(h, data_), "bytes of data for shape");
  (void)b;
}

TEST_F(MalformedImport, OverlappingTensors) {
  nlohmann::json h = header_;
  // Point ln_f.weight at ln_f.bias's bytes (same size): two tensors share a range.
  h["transformer.ln_f.weight"]["data_offsets"] = h["transformer.ln_f.bias"]["data_offsets"];
  expect_rejected(file_with(h, data_), "overlap");
}

TEST_F(MalformedImport, HugeOrBrokenHeader) {
  expect_rejected(u64le(uint64_t(1) << 62) + "{}", "over the 100000000-byte limit");
  expect_rejected(u64le(1000) + "{\"a\": 1}", "runs past the end of the file");
  expect_rejected(std::string("\x05\x00", 2), "fewer than the 8 of the header length");
  expect_rejected(u64le(5) + "{abc}", "not JSON");
  expect_rejected(u64le(2) + "[]", "does not start with '{'");
  nlohmann::json h = header_;
  h["transformer.wpe.weight"]["shape"] = {-1, 16};
  expect_rejected(file_with(h, data_), "bad dimension");
}

TEST_F(MalformedImport, MissingTensorsAndConfigKeys) {
  nlohmann::json h = header_;
  const uint64_t b = h["transformer.ln_f.bias"]["data_offsets"][0];
  h.erase("transformer.ln_f.bias");  // and its bytes, which are the last ones
  ASSERT_EQ(uint64_t(h["transformer.ln_f.weight"]["data_offsets"][1]), b) << "the export's order changed";
  expect_rejected(file_with(h, data_.substr(0, b)), "no tensor 'transformer.ln_f.bias'");
  nlohmann::json c = nlohmann::json::parse(config_);
  c.erase("n_embd");
  expect_rejected(file_with(header_, data_), "missing key 'n_embd'", c.dump());
  c = nlohmann::json::parse(config_);
  c["n_embd"] = 32;  // shapes no longer agree
  expect_rejected(file_with(header_, data_), "config.json implies", c.dump());
  c = nlohmann::json::parse(config_);
  c["activation_function"] = "relu";
  expect_rejected(file_with(header_, data_), "activation_function", c.dump());
  expect_rejected(file_with(header_, data_), "not valid JSON", "{\"n_layer\": ");
}

// Output directories that cannot be created are bad input, named by their option.
TEST_F(MalformedImport, OutputDirectoriesThatCannotBeCreated) {
  write_all(dir_.file("a_file"), "x");
  const std::string under_file = dir_.file("a_file") + "/sub";
  CliRun e = flashgpt("export " + dir_.file("run") + " --hf " + under_file);
  EXPECT_EQ(e.code, 2) << e.out;
  EXPECT_NE(e.out.find("error: --hf '" + under_file + "': cannot create the directory"), std::string::npos) << e.out;
  CliRun i = flashgpt("import " + dir_.file("good") + " --out " + under_file);
  EXPECT_EQ(i.code, 2) << i.out;
  EXPECT_NE(i.out.find("error: --out '" + under_file + "': cannot create the directory"), std::string::npos) << i.out;
}

// A config.json far larger than its weights is named before anything of its size is
// allocated. It used to be allocated first: with n_layer 2^20 the import was killed by
// the kernel's OOM killer after ~110 s on a 24 GB machine; the larger tables failed as
// "out of host memory", which did not name config.json.
TEST_F(MalformedImport, ConfigLargerThanTheWeightsIsNotAllocated) {
  nlohmann::json c = nlohmann::json::parse(config_);
  c["n_layer"] = 1 << 20;
  expect_rejected(file_with(header_, data_), "n_layer is 1048576, but the weights hold", c.dump());
  c = nlohmann::json::parse(config_);
  c["n_positions"] = 1 << 30;
  expect_rejected(file_with(header_, data_), "config.json implies (1073741824, ", c.dump());
  c = nlohmann::json::parse(config_);
  c["vocab_size"] = 1 << 30;
  expect_rejected(file_with(header_, data_), "config.json implies (1073741824, ", c.dump());
}

// ---- sample ------------------------------------------------------------------------
// A model with GPT-2's vocabulary (the tokenizer's) but tiny otherwise.
const ModelConfig kGpt2Vocab = {2, 2, 16, 50257, 50304, 64};

TEST(Sample, SameSeedSameTextOtherSeedOtherText) {
  test::ScratchDir dir("fg_sample_");
  const std::string ckpt = make_checkpoint(dir.file("run"), kGpt2Vocab, DType::f32, 9);
  const std::string common = "sample " + ckpt + " --vocab " + vocab_dir() + " --max-new-tokens 20 --device cpu ";
  const CliRun a = flashgpt(common + "--prompt 'Hello world' --seed 5 --top-k 50", false);
  const CliRun b = flashgpt(common + "--prompt 'Hello world' --seed 5 --top-k 50", false);
  const CliRun c = flashgpt(common + "--prompt 'Hello world' --seed 6 --top-k 50", false);
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_EQ(a.out.rfind("Hello world", 0), 0u) << "the prompt comes first: " << a.out;
  EXPECT_GT(a.out.size(), std::string("Hello world").size() + 10);
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
  // --prompt - reads stdin; several samples come one after the other.
  const CliRun d = flashgpt("sample " + ckpt + " --vocab " + vocab_dir() +
                         " --max-new-tokens 20 --device cpu --seed 5 --top-k 50 --prompt - --num-samples 2 < /dev/null", false);
  ASSERT_EQ(d.code, 0) << d.out;
  EXPECT_NE(d.out.find("--- sample 1 ---"), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("--- sample 2 ---"), std::string::npos) << d.out;
  // Greedy is deterministic whatever the seed.
  EXPECT_EQ(flashgpt(common + "--prompt 'Hi' --temperature 0 --seed 1", false).out,
            flashgpt(common + "--prompt 'Hi' --temperature 0 --seed 2", false).out);
  EXPECT_EQ(flashgpt(common + "--prompt 'Hi' --top-p 1.5").code, 2);
}

// A model with rotary positions samples too (its KV cache holds rotated keys), the same
// text for the same seed.
TEST(Sample, RotaryPositionModelsSample) {
  test::ScratchDir dir("fg_sample_rope_");
  ModelConfig rope = kGpt2Vocab;
  rope.position = PositionEncoding::rope;
  const std::string ckpt = make_checkpoint(dir.file("run"), rope, DType::f32, 10);
  const std::string cmd = "sample " + ckpt + " --vocab " + vocab_dir() +
                          " --max-new-tokens 20 --device cpu --prompt 'Hello world' --seed 5 --top-k 50";
  const CliRun a = flashgpt(cmd, false), b = flashgpt(cmd, false);
  ASSERT_EQ(a.code, 0) << flashgpt(cmd).out;
  EXPECT_EQ(a.out.rfind("Hello world", 0), 0u) << a.out;
  EXPECT_GT(a.out.size(), std::string("Hello world").size() + 10);
  EXPECT_EQ(a.out, b.out);
}

// ---- eval --text ---------------------------------------------------------------------
// Scores every token once with the documented contexts: checked against per-token
// negative log-likelihoods computed independently, each from its own context through the
// KV-cache decoder (fp64).
TEST(EvalText, SlidingWindowScoresEachTokenOnceWithItsContext) {
  test::ScratchDir dir("fg_evaltext_");
  const std::string ckpt = make_checkpoint(dir.file("run"), kGpt2Vocab, DType::f64, 4);
  const std::string text = "The quick brown fox jumps over the lazy dog. It was the best of times, it was the worst of times.";
  write_all(dir.file("t.txt"), text);
  Tokenizer tok(vocab_dir());
  std::vector<int32_t> ids = {Tokenizer::kEndOfText};
  for (int32_t id : tok.encode(text)) ids.push_back(id);
  const int64_t N = int64_t(ids.size()) - 1;
  ASSERT_GT(N, 20);

  auto ops = make_cpu_ops();
  GPT2 model(kGpt2Vocab, *ops, DType::f64, 1, 1);
  load_model_weights(ckpt, model);
  auto nll = [&](int64_t first, int64_t target) {  // −log p(ids[target] | ids[first, target))
    GPT2Decoder dec(model, 1, int(target - first));
    std::vector<double> logits;
    dec.step(ids.data() + first, int(target - first), logits);
    double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
    for (double l : logits) z += std::exp(l - mx);
    return mx + std::log(z) - logits[size_t(ids[size_t(target)])];
  };
  for (auto [T, S] : {std::pair{8, 3}, {8, 8}, {8, 1}, {64, 32}}) {
    TextEvalOptions o;
    o.checkpoint = ckpt; o.text_file = dir.file("t.txt"); o.seq_len = T; o.stride = S;
    o.device = "cpu"; o.precision = "fp64"; o.vocab = vocab_dir(); o.batch_size = 3;
    const TextEvalResult r = evaluate_text(o);
    EXPECT_EQ(r.tokens, N);
    // Target j is scored by the first window that reaches it: start = the largest multiple
    // of S with start + T >= j, at least 0, and its context is ids[start, j).
    double sum = 0;
    for (int64_t j = 1; j <= N; ++j) {
      int64_t start = 0;
      while (start + T < j) start += S;
      EXPECT_GE(j - start, std::min<int64_t>(j, T - S + 1)) << "context of token " << j;
      EXPECT_LE(j - start, T) << "context of token " << j;
      sum += nll(start, j);
    }
    EXPECT_NEAR(r.loss, sum / double(N), 1e-12 * std::fabs(sum / double(N))) << "T " << T << ", S " << S;
  }
}

// A zero or negative window or stride is refused (it used to be taken as "the default").
TEST(EvalText, RefusesAWindowOrStrideBelowOne) {
  test::ScratchDir dir("fg_evaltext_args_");
  const std::string ckpt = make_checkpoint(dir.file("run"), kGpt2Vocab, DType::f32, 2);
  write_all(dir.file("t.txt"), "Some text to score.");
  const std::string cmd = "eval " + ckpt + " --device cpu --vocab " + vocab_dir() + " --text " + dir.file("t.txt") + " ";
  const CliRun ok = flashgpt(cmd + "--seq-len 8 --stride 4");
  ASSERT_EQ(ok.code, 0) << ok.out;
  for (const char* bad : {"--stride 0", "--stride -3", "--seq-len 0", "--seq-len -1"}) {
    const CliRun r = flashgpt(cmd + bad);
    EXPECT_EQ(r.code, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("not in range 1 to"), std::string::npos) << bad << ": " << r.out;
  }
}

// ---- train --init-from ---------------------------------------------------------------
TEST(InitFrom, LoadsWeightsAndRejectsAnotherShape) {
  test::ScratchDir dir("fg_initfrom_");
  const std::string ckpt = make_checkpoint(dir.file("run"), kSmall, DType::f32, 8);
  auto ops = make_cpu_ops();
  GPT2 model(kSmall, *ops, DType::f32, 1, 4);
  model.init_random(1);
  init_from_checkpoint(dir.file("run"), model);
  std::vector<char> raw(model.params().nbytes());
  ops->to_host(raw.data(), model.params());
  const std::vector<char> want = weights_of(ckpt, kSmall, DType::f32);
  EXPECT_EQ(std::memcmp(raw.data(), want.data(), raw.size()), 0);
  ModelConfig other = kSmall;
  other.n_layer = 3;
  GPT2 wrong(other, *ops, DType::f32, 1, 4);
  EXPECT_THROW(init_from_checkpoint(ckpt, wrong), InputError);
  // The position encoding is part of the model: named in the message, for --resume too.
  ModelConfig rope = kSmall;
  rope.position = PositionEncoding::rope;
  GPT2 rotary(rope, *ops, DType::f32, 1, 4);
  for (const char* option : {"--init-from", "--resume"}) {
    try {
      check_checkpoint_model(ckpt, rotary, option);
      ADD_FAILURE() << option << ": a learned-position checkpoint accepted for a RoPE model";
    } catch (const InputError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind(option, 0), 0u) << msg;
      EXPECT_NE(msg.find("position learned) differs from the config's"), std::string::npos) << msg;
      EXPECT_NE(msg.find("position rope)"), std::string::npos) << msg;
    }
  }
  Config c = load_config("", {"train.init_from=" + ckpt});
  EXPECT_EQ(c.train.init_from, ckpt);
}

}  // namespace
}  // namespace flashgpt

// Deterministic mutation fuzzing of every reader of user files: the config parser (YAML
// and --set), token shards, checkpoints, Hugging Face directories (`flashgpt import`),
// and the tokenizer (its vocabulary files, decode and encode).
//
// Each target starts from valid inputs, applies a few random edits (to bytes, to lines,
// or to fields of the JSON inside a file), hands the result to the reader and requires
// that it either succeeds or throws flashgpt::InputError with a one-line message (which
// the program prints as "error: ..." with exit status 2). Anything else fails: another
// exception, a crash, or a hang (the watchdog below aborts an iteration stuck for long).
// Each target also counts how many inputs got past its first gate (the YAML syntax, a
// shard's magic, a checkpoint's checksums) and requires a sizable share, so that a
// fuzzer stopped at the door cannot pass unnoticed. A few rejected inputs are then run
// through the real binary: exit status 2, one line on stderr, the same message.
//
// Iterations: the CI default per target (a few thousand in all, ~5 s on 2 cores), or
// FLASHGPT_FUZZ_ITERS=N per target. The seed is the test's (tests/testing.h): a failure
// prints it, FLASHGPT_TEST_SEED=<seed> reproduces it, and another seed explores further.
// Regression tests for the bugs the fuzzer found are at the end of the file.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <algorithm>
#include <cctype>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/loader.h"
#include "data/shard.h"
#include "data/tokenizer.h"
#include "layers/gpt2.h"
#include "optim/adamw.h"
#include "src/checksum.h"
#include "src/config.h"
#include "src/errors.h"
#include "tests/testing.h"
#include "tests/vocab.h"
#include "tests/train_fixture.h"
#include "train/backend.h"
#include "train/checkpoint.h"
#include "train/comm.h"
#include "train/data_parallel.h"
#include "train/hf_interop.h"
#include "train/load_model.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace flashgpt {
namespace {

// ---- harness ----------------------------------------------------------------------

int iterations(int ci_default) {
  const char* env = std::getenv("FLASHGPT_FUZZ_ITERS");
  return env && *env ? std::max(1, std::atoi(env)) : ci_default;
}

// An input for a failure message: printable ASCII kept, the rest as \xNN, cut at 400.
std::string show(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && out.size() < 400; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') out += char(c);
    else if (c == '\n') out += "\\n";
    else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return s.size() > 400 ? out + "... (" + std::to_string(s.size()) + " bytes)" : out;
}

struct Outcome {
  enum Kind { ok, rejected, other } kind = ok;
  std::string message;  // InputError's or the other exception's
};

// Runs f: ok, rejected (InputError) or other (any other exception).
template <class F> Outcome attempt(F&& f) {
  try {
    f();
    return {};
  } catch (const InputError& e) {
    return {Outcome::rejected, e.what()};
  } catch (const std::exception& e) {
    return {Outcome::other, std::string("std::exception: ") + e.what()};
  } catch (...) {
    return {Outcome::other, "an exception not derived from std::exception"};
  }
}

// Whether s is well-formed UTF-8 (no byte that decode_utf8, the tokenizer's decoder,
// finds invalid: overlong forms, surrogates and code points past U+10FFFF included).
bool is_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const Utf8Char u = decode_utf8(s, i);
    if (u.code_point == kInvalidCodePoint) return false;
    i += u.length;
  }
  return true;
}

// The property of every target. Returns whether it held (the caller stops early on the
// first failure: one input to reproduce is enough).
bool expect_ok_or_input_error(const Outcome& o, const std::string& input) {
  if (o.kind == Outcome::other) {
    ADD_FAILURE() << "not an InputError: " << o.message << "\n  input: " << show(input);
    return false;
  }
  if (o.kind == Outcome::rejected && (o.message.empty() || o.message.find('\n') != std::string::npos)) {
    ADD_FAILURE() << "InputError message is not one line: '" << show(o.message) << "'\n  input: " << show(input);
    return false;
  }
  // The message reaches a terminal (and JSON, where a caller logs it): raw bytes of the
  // input that are not UTF-8 must come escaped.
  if (o.kind == Outcome::rejected && !is_utf8(o.message)) {
    ADD_FAILURE() << "InputError message is not UTF-8: '" << show(o.message) << "'\n  input: " << show(input);
    return false;
  }
  return true;
}

// Turns a hang into a failure that names the input: abort()s when one iteration runs
// longer than `limit_s` (else a reader stuck in a loop stalls ctest with no hint).
class Watchdog {
 public:
  explicit Watchdog(double limit_s) : thread_([this, limit_s] { watch(limit_s); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  // Starts the next iteration on `input`.
  void tick(const std::string& input) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      input_ = input;
      ++count_;
    }
    wake_.notify_all();
  }

 private:
  void watch(double limit_s) {
    std::unique_lock<std::mutex> lock(mutex_);
    uint64_t seen = count_;
    while (!done_) {
      const bool progressed = wake_.wait_for(lock, std::chrono::duration<double>(limit_s),
                                             [&] { return done_ || count_ != seen; });
      if (!progressed) {
        std::fprintf(stderr, "fuzz: an iteration hung for %.0f s (FLASHGPT_TEST_SEED=%llu), input: %s\n", limit_s,
                     static_cast<unsigned long long>(test::test_seed()), show(input_).c_str());
        std::abort();
      }
      seen = count_;
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  uint64_t count_ = 0;
  std::string input_;
  std::thread thread_;  // last: starts after the members above exist
};
constexpr double kHangSeconds = 60;  // a normal iteration takes milliseconds (x10 under ASan)

// ---- mutations --------------------------------------------------------------------

// Text likely to matter to a YAML or JSON reader, inserted whole.
const std::vector<std::string> kTokens = {
    ": ", "\n", "- ", "{", "}", "[", "]", "\"", "'", ",", "-1", "0", "1e999", "-1e999", "nan", ".inf", "-.inf",
    "2147483648", "-2147483649", "18446744073709551616", "0x10", "1.5", "~", "null", "true", "&a ", "*a", "!!str ",
    "!!binary ", "!!map ", "? ", "#", "\t", "<<: ", "|\n", ">\n", "---\n", "...\n", "%YAML 1.2\n", "\xff", "\xc3",
    std::string(1, '\0'), "model:", "train:", "n_head", "\\u0000", "\\", std::string(3000, '['),
    std::string(1000, '{')};

// Stands for a value nested thousands of levels deep, which cannot be built as a json
// here (copying or printing it would overflow this test's stack): Mutator::dump()
// writes it out as text.
const std::string kDeep = "\x01" "deep" "\x01";

class Mutator {
 public:
  explicit Mutator(std::mt19937_64& rng) : rng_(rng) {}

  size_t below(size_t n) { return n ? size_t(rng_() % n) : 0; }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T> const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

  // 1 to 4 edits of single bytes or byte ranges.
  std::string bytes(std::string s) {
    for (size_t k = 1 + below(4); k > 0; --k) {
      const size_t at = below(s.size() + 1);
      switch (below(8)) {
        case 0:  // flip a bit
          if (at < s.size()) s[at] = char(s[at] ^ (1 << below(8)));
          break;
        case 1:  // a random byte
          if (at < s.size()) s[at] = char(below(256));
          break;
        case 2:  // insert random bytes
          s.insert(at, random_bytes(1 + below(8)));
          break;
        case 3:  // insert a token
          s.insert(at, pick(kTokens));
          break;
        case 4:  // delete a range
          s.erase(at, 1 + below(16));
          break;
        case 5: {  // duplicate a range
          const std::string part = s.substr(at, 1 + below(32));
          s.insert(below(s.size() + 1), part);
          break;
        }
        case 6:  // truncate
          s.resize(at);
          break;
        default:  // a token over existing bytes
          s.replace(at, std::min(s.size() - at, size_t(1 + below(4))), pick(kTokens));
          break;
      }
    }
    return s;
  }

  // 1 to 3 edits of whole lines: duplicate, swap, delete, or a key moved under another.
  std::string lines(const std::string& s) {
    std::vector<std::string> ls;
    for (size_t p = 0; p <= s.size();) {
      size_t e = s.find('\n', p);
      if (e == std::string::npos) e = s.size();
      ls.push_back(s.substr(p, e - p));
      p = e + 1;
    }
    for (size_t k = 1 + below(3); k > 0 && !ls.empty(); --k) {
      const size_t a = below(ls.size()), b = below(ls.size());
      switch (below(4)) {
        case 0: ls.insert(ls.begin() + long(b), ls[a]); break;
        case 1: std::swap(ls[a], ls[b]); break;
        case 2: ls.erase(ls.begin() + long(a)); break;
        default: ls[a] = std::string(below(6), ' ') + ls[a]; break;  // re-indented
      }
    }
    std::string out;
    for (size_t i = 0; i < ls.size(); ++i) out += (i ? "\n" : "") + ls[i];
    return out;
  }

  std::string random_bytes(size_t n) {
    std::string s(n, '\0');
    for (char& c : s) c = char(below(256));
    return s;
  }

  // A JSON value a reader may not expect where `old` was: another type, an extreme or an
  // off-by-one number, a near-miss string.
  json value(const json& old) {
    switch (below(7)) {
      case 0: return pick(std::vector<json>{nullptr, true, false, "", "x", json::array(), json::object(),
                                            json::array({old}), json{{"x", old}}});
      case 1: return pick(std::vector<json>{0, -1, 1, 2, 1 << 20, 1 << 30, INT32_MAX, int64_t(INT32_MAX) + 1, int64_t(INT32_MIN) - 1,
                                            uint64_t(UINT32_MAX) + 1, INT64_MIN, INT64_MAX, UINT64_MAX});
      case 2: return pick(std::vector<json>{0.5, -1.5, 2.0, 1e300, -1e300, 1e19, 4.5e18, -0.0});
      case 3: return pick(std::vector<json>{"f32", "bf16", "f64", "i32", "wte", "ckpt_000003", "../x"});
      case 4: return kDeep;
      default:
        if (old.is_number_integer()) {  // off by one, doubled, halved, negated (wrapping)
          const uint64_t v = old.get<uint64_t>();
          return pick(std::vector<json>{v + 1, v - 1, v * 2, v / 2, int64_t(0 - v), double(v) + 0.5});
        }
        if (old.is_string()) {
          const std::string v = old.get<std::string>();
          return pick(std::vector<json>{v + "x", v.substr(0, v.size() / 2), v + "/.."});
        }
        return nullptr;
    }
  }

  // j as text, with kDeep written out as arrays nested 65 (just past parse_json's limit)
  // or 100000 levels deep.
  std::string dump(const json& j, int indent = -1) {
    std::string text = j.dump(indent, ' ', false, json::error_handler_t::replace);  // keys may be any bytes
    const std::string placeholder = json(kDeep).dump();
    for (size_t at; (at = text.find(placeholder)) != std::string::npos;) {
      const size_t depth = chance(0.5) ? 65 : 100000;
      text.replace(at, placeholder.size(), std::string(depth, '[') + std::string(depth, ']'));
    }
    return text;
  }

  // One edit of j: a value (a leaf, or a whole array or object) replaced or removed,
  // or an unknown key added.
  void edit(json& j) {
    const json flat = j.flatten();  // leaf pointer -> value
    if (flat.empty() || !j.is_structured()) {
      j = value(j);
      return;
    }
    auto it = flat.begin();
    std::advance(it, long(below(flat.size())));
    json::json_pointer ptr(it.key());
    for (size_t up = below(3); up > 0 && !ptr.empty(); --up) ptr = ptr.parent_pointer();  // maybe a container
    switch (ptr.empty() ? 0 : below(4)) {
      case 0:
      case 1: j[ptr] = value(j[ptr]); break;
      case 2: {  // remove
        json& parent = j[ptr.parent_pointer()];
        if (parent.is_object()) parent.erase(ptr.back());
        else if (parent.is_array()) parent.erase(size_t(std::stoul(ptr.back())));
        break;
      }
      default: {
        json& parent = j[ptr.parent_pointer()];
        if (parent.is_object()) parent["unexpected"] = value(parent);
        else if (parent.is_array()) parent.push_back(value(parent.back()));
        break;
      }
    }
  }

 private:
  std::mt19937_64& rng_;
};

std::string slurp(const std::string& path) { return test::slurp(path); }

void spit(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(f.good()) << "cannot write " << path;
}

// Runs the real binary; returns its exit status (-1: killed by a signal) and stderr.
std::pair<int, std::string> run_binary(const std::string& args, const fs::path& scratch) {
  const std::string err = (scratch / "binary.err").string();
  const std::string cmd = std::string("OMP_NUM_THREADS=1 timeout 60 ") + test::flashgpt_binary() + " " + args +
                          " >/dev/null 2>" + err;
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(err)};
}

// What kind of rejection a message is: its first 80 characters without the scratch
// path, digits as '#' (so that targets can count distinct rejections).
std::string message_kind(std::string message, const fs::path& scratch) {
  for (size_t at; (at = message.find(scratch.string())) != std::string::npos;) message.erase(at, scratch.string().size());
  for (char& c : message)
    if (std::isdigit(static_cast<unsigned char>(c))) c = '#';
  return message.substr(0, 80);
}

// The binary on an input that the library rejected with `message`: exit status 2 and
// exactly "error: <message>" on stderr.
void expect_binary_rejects(const std::string& args, const fs::path& scratch, const std::string& message,
                           const std::string& input) {
  auto [status, err] = run_binary(args, scratch);
  EXPECT_EQ(status, 2) << "flashgpt " << args << "\n  stderr: " << err << "\n  input: " << show(input);
  EXPECT_EQ(err, "error: " + message + "\n") << "flashgpt " << args << "\n  input: " << show(input);
}

// ---- the config parser -------------------------------------------------------------

// Keys and values for random --set overrides: real keys, near misses, odd YAML.
const std::vector<std::string> kOverrideKeys = {
    "model.n_layer", "model.n_head", "model.n_embd", "model.vocab_size", "model.padded_vocab",
    "model.max_seq_len", "model.attention", "model.position", "train.batch_size", "train.seq_len",
    "train.total_batch", "train.lr", "train.seed", "train.precision", "train.recompute", "train.eps",
    "train.beta2", "train.steps", "data.train", "run.out_dir", "run.device", "train", "model.", ".lr",
    "train.lr.x", "", "=", "train.nonfinite"};
const std::vector<std::string> kOverrideValues = {
    "", "0", "1", "-1", "64", "3e-4", "1e999", "-1e999", "nan", ".nan", ".inf", "0x10", "0o17", "1_000", "1.5",
    "2147483648", "-2147483649", "18446744073709551616", "~", "null", "true", "[1, 2]", "{a: 1}", "[", "{", "\"",
    "'", "'quoted'", "!!int 3", "!!str 3", "*x", "&a 1", "? a", "a: b", "- a", "cpu", "cuda", "flash", "rope",
    "bf16", "fp64", "gelu+ln", "block+gelu", "x\ny", "\xff\xfe", "|\n  a\n  b", "\"a\\nb\""};

TEST(Fuzz, ConfigParser) {
  std::mt19937_64 rng = test::test_rng();
  Mutator m(rng);
  test::ScratchDir scratch("flashgpt_fuzz_config_");
  const std::vector<std::string> seeds = {slurp(std::string(FLASHGPT_SOURCE_DIR) + "/configs/tiny.yaml"),
                                          slurp(std::string(FLASHGPT_SOURCE_DIR) + "/configs/gpt2-124m.yaml")};
  ASSERT_FALSE(seeds[0].empty() || seeds[1].empty()) << "configs/ not found";
  const fs::path file = scratch.path / "fuzz.yaml", resolved = scratch.path / "resolved.yaml";
  const int n = iterations(2000);
  int loaded = 0, rejected_by_key = 0;
  std::vector<std::pair<std::string, std::string>> binary_cases;  // rejected file, message
  std::set<std::string> binary_kinds;  // one case per kind of message (its first words)
  Watchdog dog(kHangSeconds);
  for (int i = 0; i < n && !HasFailure(); ++i) {
    std::string text = m.pick(seeds);
    const int how = int(m.below(4));
    if (how == 0 || how == 3) text = m.lines(text);
    if (how == 1 || how == 3) text = m.bytes(text);
    std::vector<std::string> sets;
    if (how == 2 || m.chance(0.2))
      for (size_t k = 1 + m.below(3); k > 0; --k)
        sets.push_back(m.pick(kOverrideKeys) + "=" + (m.chance(0.9) ? m.pick(kOverrideValues) : m.random_bytes(3)));
    std::string input = text;
    for (const auto& s : sets) input += "\n--set " + s;
    dog.tick(input);
    spit(file, text);
    Config c;
    const Outcome o = attempt([&] { c = load_config(file.string(), sets); });
    if (!expect_ok_or_input_error(o, input)) break;
    if (o.kind == Outcome::ok) {
      ++loaded;
      // What loaded must load again from the resolved YAML that runs and checkpoints
      // save, to the same values.
      const std::string yaml = config_to_yaml(c);
      spit(resolved, yaml);
      Config again;
      const Outcome o2 = attempt([&] { again = load_config(resolved.string(), {}); });
      EXPECT_EQ(o2.kind, Outcome::ok) << o2.message << "\n  resolved: " << show(yaml) << "\n  input: " << show(input);
      if (o2.kind == Outcome::ok) EXPECT_EQ(config_to_yaml(again), yaml) << "input: " << show(input);
    } else {
      rejected_by_key += o.message.rfind("config key", 0) == 0;
      if (sets.empty() && binary_cases.size() < 6 && binary_kinds.insert(o.message.substr(0, 16)).second)
        binary_cases.emplace_back(text, o.message);
    }
  }
  if (HasFailure()) return;  // the counts below mean nothing after an early stop
  // Past the YAML syntax: some configs load, many reach the typed keys and validation.
  EXPECT_GE(loaded, n / 20) << "too few mutated configs still load";
  EXPECT_GE(rejected_by_key, n / 10) << "too few mutations reach the typed keys and their validation";
  std::printf("[   FUZZ   ] config: %d inputs, %d loaded, %d rejected at a key\n", n, loaded, rejected_by_key);

  for (const auto& [text, message] : binary_cases) {
    spit(file, text);
    expect_binary_rejects("train -c " + file.string(), scratch.path, message, text);
  }
}

// ---- token shards ------------------------------------------------------------------

TEST(Fuzz, ShardReader) {
  std::mt19937_64 rng = test::test_rng();
  Mutator m(rng);
  test::ScratchDir scratch("flashgpt_fuzz_shard_");
  const int kVocab = 256, B = 2, T = 8;
  std::vector<uint16_t> tokens(300);
  for (auto& t : tokens) t = uint16_t(m.below(kVocab));
  const fs::path path = scratch.path / "train_000000.bin";
  write_shard(path.string(), tokens);
  write_shard((scratch.path / "train_000001.bin").string(), tokens);  // a second, intact shard
  const std::string original = slurp(path.string());
  const LoaderOptions opts{(scratch.path / "train_*.bin").string(), B, T, 0, 1, 7, true, kVocab, 0};
  const json state = DataLoader(opts).state();

  const std::vector<int32_t> kInts = {0, 1, -1, 2, 255, 300, 301, 299, 600, INT32_MAX, INT32_MIN, 20240520,
                                      20240521, 65536, 1 << 30};
  const int n = iterations(1000);
  int opened = 0, loaded = 0;
  Watchdog dog(kHangSeconds);
  for (int i = 0; i < n && !HasFailure(); ++i) {
    std::string bytes = original;
    switch (m.below(4)) {
      case 0: {  // a header field: magic, version, count, or a reserved one
        const int32_t v = m.pick(kInts);
        const size_t field = m.chance(0.8) ? m.below(3) : m.below(kShardHeaderInts);
        std::memcpy(&bytes[field * 4], &v, 4);
        break;
      }
      case 1:  // the size: cut or grown
        if (m.chance(0.5)) bytes.resize(m.below(bytes.size()));
        else bytes += m.random_bytes(1 + m.below(8));
        break;
      case 2: {  // token ids (some >= the vocabulary)
        for (size_t k = 1 + m.below(3); k > 0; --k) {
          const uint16_t id = uint16_t(m.chance(0.5) ? kVocab + m.below(65536 - kVocab) : m.below(kVocab));
          std::memcpy(&bytes[kShardHeaderBytes + 2 * m.below(tokens.size())], &id, 2);
        }
        break;
      }
      default:
        bytes = m.bytes(bytes);
    }
    dog.tick(bytes);
    spit(path, bytes);
    bool view_ok = false;
    const Outcome o = attempt([&] {
      ShardView view(path.string());
      view_ok = true;
      // What opened must be what the file holds: the header's count and the size agree.
      EXPECT_EQ(kShardHeaderBytes + view.size() * 2, bytes.size());
      DataLoader loader(opts);
      std::vector<int32_t> in(B * T), tg(B * T);
      for (int s = 0; s < 40; ++s) {  // past the end of an epoch of the intact shards
        loader.next(in.data(), tg.data());
        for (int k = 0; k < B * T; ++k) ASSERT_TRUE(in[k] >= 0 && in[k] < kVocab && tg[k] >= 0 && tg[k] < kVocab);
      }
      loader.restore(state);
    });
    if (!expect_ok_or_input_error(o, bytes)) break;
    opened += view_ok;
    loaded += o.kind == Outcome::ok;
  }
  if (HasFailure()) return;
  // Past the header: a share of the shards open, and some of them feed whole batches.
  EXPECT_GE(opened, n / 5) << "too few mutated shards get past the header checks";
  EXPECT_GE(loaded, n / 20) << "too few mutated shards reach the loader";
  std::printf("[   FUZZ   ] shard: %d inputs, %d opened, %d loaded\n", n, opened, loaded);
}

// ---- checkpoints -------------------------------------------------------------------

uint32_t crc32c(const std::string& bytes) {
  Crc32c sum;
  sum.add(bytes.data(), bytes.size());
  return sum.value();
}

// model.bin and optimizer.bin: [magic 8][header length u64][header JSON][data];
// safetensors files: the same without the magic (magic_bytes 0).
struct Packed {
  std::string magic, header, data;
  static Packed split(const std::string& b, size_t magic_bytes = 8) {
    uint64_t n;
    std::memcpy(&n, b.data() + magic_bytes, 8);
    return {b.substr(0, magic_bytes), b.substr(magic_bytes + 8, n), b.substr(magic_bytes + 8 + n)};
  }
  std::string join() const {
    const uint64_t n = header.size();
    return magic + std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
  }
};

// A file of the checkpoint, mutated: the JSON inside by structure most of the time (so
// that it still parses and the reader gets to its fields), else byte by byte.
std::string mutate_checkpoint_file(const std::string& name, const std::string& bytes, Mutator& m) {
  const bool is_bin = name == "model.bin" || name == "optimizer.bin";
  if (is_bin && m.chance(0.75)) {
    Packed p = Packed::split(bytes);
    switch (m.below(5)) {
      case 0:
      case 1:
      case 2: {
        json h = json::parse(p.header);
        for (size_t k = 1 + m.below(2); k > 0; --k) m.edit(h);
        p.header = m.dump(h);
        break;
      }
      case 3: p.header = m.bytes(p.header); break;
      default:  // the data: cut, grown, or bytes changed (NaN, Inf, anything)
        p.data = m.chance(0.5) ? p.data.substr(0, m.below(p.data.size())) : m.bytes(p.data);
    }
    std::string out = p.join();
    if (m.chance(0.1)) {  // a header length that lies
      const uint64_t n = m.pick(std::vector<uint64_t>{0, p.header.size() + 1, p.header.size() - 1, UINT64_MAX,
                                                      UINT64_MAX - 15, uint64_t(1) << 63});
      std::memcpy(&out[8], &n, 8);
    }
    return out;
  }
  if ((name == "state.json" || name == "checksums.json") && m.chance(0.7)) {
    json j = json::parse(bytes);
    for (size_t k = 1 + m.below(2); k > 0; --k) m.edit(j);
    return m.dump(j, 1);
  }
  return m.chance(0.3) ? m.lines(bytes) : m.bytes(bytes);
}

// The checkpoint of a small run: a tiny model, its optimizer state, and a loader three
// batches into the data (saved as `flashgpt train` would, at step 3).
struct CheckpointFixture {
  test::ScratchDir scratch{"flashgpt_fuzz_ckpt_"};
  Config cfg;
  std::unique_ptr<Ops> ops = make_cpu_ops();
  std::unique_ptr<GPT2> model;
  std::unique_ptr<DataLoader> loader;
  std::string run_dir, ckpt;
  std::map<std::string, std::string> files;  // name -> bytes of the saved checkpoint

  CheckpointFixture() {
    std::vector<uint16_t> tokens(400);
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t((i * 7) % 256);
    write_shard(scratch.file("val_000000.bin"), tokens);
    cfg = load_config("", {"model.n_layer=1", "model.n_head=1", "model.n_embd=8", "model.vocab_size=256",
                           "model.padded_vocab=256", "model.max_seq_len=16", "train.batch_size=1",
                           "train.seq_len=4", "train.precision=fp32", "run.device=cpu",
                           "data.train=" + scratch.file("val_*.bin"), "data.val=" + scratch.file("val_*.bin"),
                           "run.out_dir=" + scratch.file("out")});
    spit(scratch.file("train.yaml"), config_to_yaml(cfg));
    model = std::make_unique<GPT2>(model_config(cfg), *ops, DType::f32, 1, 4);
    model->init_random(3);
    // The training loader of `flashgpt train` with this config.
    loader = std::make_unique<DataLoader>(LoaderOptions{cfg.data.train, 1, 4, 0, 1, cfg.train.seed, true, 256, 0});
    std::vector<int32_t> in(4), tg(4);
    for (int s = 0; s < 3; ++s) loader->next(in.data(), tg.data());
    AdamW opt(*model, adamw_config(cfg));
    auto single = make_host_communicator();
    DataParallel dp(*model, *single, 1);
    const OptimizerSource source{opt.steps_done(), DType::f32, 2,
                                 [&](int k, std::string& bytes) { dp.gather_state(opt, k, &bytes); }};
    run_dir = scratch.file("run");
    ckpt = save_checkpoint(run_dir, *model, &source, {3, loader->state(), {}}, config_to_yaml(cfg));
    for (const char* name : {"model.bin", "optimizer.bin", "state.json", "config.yaml", "checksums.json"})
      files[name] = slurp((fs::path(ckpt) / name).string());
    files["../latest"] = slurp(run_dir + "/latest");
  }

  void write(const std::map<std::string, std::string>& contents) {
    for (const auto& [name, bytes] : contents) spit(fs::path(ckpt) / name, bytes);
  }

  // What eval and resume read, in their order: the directory, its config, the weights,
  // the optimizer state and the loader position.
  void load() {
    const std::string dir = resolve_checkpoint(run_dir);
    load_checkpoint_config(dir);
    load_model_weights(dir, *model);
    const size_t bytes = model->num_params() * sizeof(float);
    const OptimizerSink sink{DType::f32, 2, [&](int, const std::string& t) {
                               if (t.size() != bytes) throw std::logic_error("optimizer state of the wrong size");
                             }};
    const CheckpointState st = load_checkpoint(dir, *model, sink);
    load_optimizer_state(dir, *model, sink);
    loader->restore(st.loader);
  }
};

// checksums.json as save_checkpoint writes it, for the files as they are now: the
// mutation then reaches the parser behind the checksums.
std::string checksums_of(const std::map<std::string, std::string>& files) {
  json sums;
  for (const char* name : {"config.yaml", "model.bin", "optimizer.bin", "state.json"})
    sums[name] = crc32c(files.at(name));
  return json{{"algorithm", "crc32c"}, {"files", sums}}.dump(1);
}

TEST(Fuzz, CheckpointReader) {
  std::mt19937_64 rng = test::test_rng();
  Mutator m(rng);
  CheckpointFixture f;
  ASSERT_NO_THROW(f.load()) << "the intact checkpoint must load";
  const std::vector<std::string> targets = {"model.bin", "model.bin", "model.bin", "optimizer.bin",
                                            "optimizer.bin", "state.json", "state.json", "state.json",
                                            "config.yaml", "checksums.json", "../latest"};
  const int n = iterations(800);
  int stale = 0, recomputed = 0, behind_checksums = 0, loaded = 0;
  std::map<std::string, int> messages;  // distinct rejections behind the checksums
  std::vector<std::pair<std::map<std::string, std::string>, std::string>> binary_cases;  // files, message
  Watchdog dog(kHangSeconds);
  for (int i = 0; i < n && !HasFailure(); ++i) {
    std::map<std::string, std::string> files = f.files;
    const std::string& target = m.pick(targets);
    files[target] = mutate_checkpoint_file(target, files[target], m);
    if (files[target] == f.files.at(target)) continue;  // nothing changed
    const bool sums_apply = target != "checksums.json" && target != "../latest";
    const bool keep_stale = sums_apply && m.chance(0.25);
    if (sums_apply && !keep_stale) files["checksums.json"] = checksums_of(files);
    const std::string input = target + ": " + files[target];
    dog.tick(input);
    f.write(files);
    const Outcome o = attempt([&] { f.load(); });
    if (!expect_ok_or_input_error(o, input)) break;
    const bool checksum_error = o.message.find("checksum") != std::string::npos;
    if (keep_stale) {
      ++stale;
      // A changed file whose checksum was not updated is corruption: always rejected.
      EXPECT_TRUE(o.kind == Outcome::rejected && checksum_error)
          << "a changed " << target << " with a stale checksum was not rejected: " << o.message;
    } else if (sums_apply) {
      ++recomputed;
      behind_checksums += !checksum_error;
      loaded += o.kind == Outcome::ok;
      if (o.kind == Outcome::rejected) {
        if (++messages[message_kind(o.message, f.scratch.path)] == 1 && target != "config.yaml" &&
            binary_cases.size() < 6)
          binary_cases.emplace_back(files, o.message);
      }
    }
  }
  if (HasFailure()) return;
  f.write(f.files);
  ASSERT_NO_THROW(f.load()) << "the restored checkpoint must load";
  // The parsers behind the checksums are reached, and reject in many different ways.
  EXPECT_GE(behind_checksums, recomputed * 9 / 10) << "recomputed checksums must let the mutation through";
  EXPECT_GE(recomputed, n / 2);
  EXPECT_GE(int(messages.size()), 40) << "too few distinct rejections behind the checksums";
  EXPECT_GT(loaded, 0) << "no mutation behind the checksums loaded (data bytes should)";
  std::printf("[   FUZZ   ] checkpoint: %d inputs, %d stale (all rejected), %d past the checksums (%d loaded, "
              "%zu distinct rejections)\n", n, stale, behind_checksums, loaded, messages.size());

  // The same rejections from the real program, which reads what load() reads except
  // the checkpoint's config.yaml: `flashgpt train --resume` of the run directory.
  for (const auto& [files, message] : binary_cases) {
    f.write(files);
    expect_binary_rejects("train -c " + f.scratch.file("train.yaml") + " --resume " + f.run_dir, f.scratch.path,
                          message, message);
  }
  f.write(f.files);
}

// ---- Hugging Face import ------------------------------------------------------------

// Three Hugging Face directories of one tiny GPT-2 as `flashgpt export --hf` writes them
// (F32 and BF16), and the F32 one cut into two shards with model.safetensors.index.json.
struct HfFixture {
  test::ScratchDir scratch{"flashgpt_fuzz_hf_"};
  std::vector<std::map<std::string, std::string>> dirs;  // file name -> bytes

  HfFixture() {
    const ModelConfig mc = {2, 2, 8, 100, 128, 16};
    auto ops = make_cpu_ops();
    GPT2 model(mc, *ops, DType::f32, 1, 1);
    model.init_random(5);
    Config cfg;
    set_model_config(cfg, mc);
    cfg.train.seq_len = mc.max_seq_len;
    const std::string ckpt = save_checkpoint(scratch.file("run"), model, nullptr, {}, config_to_yaml(cfg));
    for (const char* dtype : {"f32", "bf16"}) {
      const std::string out = scratch.file(std::string("hf_") + dtype);
      export_hf({ckpt, out, dtype, ""});
      dirs.push_back({{"config.json", slurp(out + "/config.json")},
                      {"model.safetensors", slurp(out + "/model.safetensors")}});
    }
    // The shards: the export's tensors split in two files, each tiled in order.
    const Packed whole = Packed::split(dirs[0].at("model.safetensors"), 0);
    const json h = json::parse(whole.header);
    std::vector<std::string> names;
    for (auto& [name, v] : h.items())
      if (name != "__metadata__") names.push_back(name);
    std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
      return h[a]["data_offsets"][0].get<uint64_t>() < h[b]["data_offsets"][0].get<uint64_t>();
    });
    std::map<std::string, std::string> sharded = {{"config.json", dirs[0].at("config.json")}};
    json index = {{"metadata", {{"total_size", whole.data.size()}}}, {"weight_map", json::object()}};
    for (size_t part = 0; part < 2; ++part) {
      const std::string file = "model-0000" + std::to_string(part + 1) + "-of-00002.safetensors";
      Packed shard;
      json sh = json::object();
      for (size_t i = part * names.size() / 2; i < (part + 1) * names.size() / 2; ++i) {
        json t = h[names[i]];
        const uint64_t b = t["data_offsets"][0], e = t["data_offsets"][1];
        t["data_offsets"] = {shard.data.size(), shard.data.size() + (e - b)};
        shard.data += whole.data.substr(b, e - b);
        sh[names[i]] = t;
        index["weight_map"][names[i]] = file;
      }
      shard.header = sh.dump();
      sharded[file] = shard.join();
    }
    sharded["model.safetensors.index.json"] = index.dump(2);
    dirs.push_back(sharded);
  }

  // Writes `files` as the directory `case`, alone.
  std::string write(const std::map<std::string, std::string>& files) {
    const fs::path dir = scratch.path / "case";
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& [name, bytes] : files) spit(dir / name, bytes);
    return dir.string();
  }
};

// A file of a Hugging Face directory, mutated: JSON by structure most of the time (a
// safetensors header with its length kept true), else byte by byte.
std::string mutate_hf_file(const std::string& name, const std::string& bytes, Mutator& m) {
  if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) {
    Packed st = Packed::split(bytes, 0);
    json h = json::parse(st.header);
    std::vector<std::string> tensors;
    for (auto& [k, v] : h.items())
      if (k != "__metadata__") tensors.push_back(k);
    switch (m.below(8)) {
      case 0:
      case 1:
        for (size_t k = 1 + m.below(2); k > 0; --k) m.edit(h);
        st.header = m.dump(h);
        break;
      case 2: {  // a tensor renamed, or given another dtype of its size: the file stays well-formed
        const std::string old = m.pick(tensors);
        if (m.chance(0.5)) {
          const std::string dtype = h[old]["dtype"];
          h[old]["dtype"] = dtype == "F32" ? m.pick(std::vector<std::string>{"I32", "U32"})
                                           : m.pick(std::vector<std::string>{"F16", "I16", "U16"});
        } else {
          h[m.pick(std::vector<std::string>{"transformer.h.2.ln_1.weight", "lm_head.weight", "transformer.h.0.attn.bias",
                                            "h.0.ln_1.weight", "transformer.wte", old + "x", ""})] = h[old];
          h.erase(old);
        }
        st.header = h.dump();
        break;
      }
      case 3: st.header = m.bytes(st.header); break;
      case 4: st.data = m.chance(0.5) ? st.data.substr(0, m.below(st.data.size())) : m.bytes(st.data); break;
      case 5:
      case 6:  // data bytes overwritten in place (NaN, Inf, anything)
        for (size_t k = 1 + m.below(8); k > 0 && !st.data.empty(); --k) st.data[m.below(st.data.size())] = char(m.below(256));
        break;
      default: return m.bytes(bytes);  // the length field too
    }
    return st.join();
  }
  if (m.chance(0.7)) {
    json j = json::parse(bytes);
    for (size_t k = 1 + m.below(2); k > 0; --k) m.edit(j);
    return m.dump(j, 2);
  }
  return m.chance(0.3) ? m.lines(bytes) : m.bytes(bytes);
}

TEST(Fuzz, HfImport) {
  std::mt19937_64 rng = test::test_rng();
  Mutator m(rng);
  HfFixture f;
  const std::string out = f.scratch.file("out");
  for (const auto& files : f.dirs) {  // the intact directories import
    fs::remove_all(out);
    ASSERT_NO_THROW(import_hf({f.write(files), out}));
  }
  const int n = iterations(600);
  int imported = 0, st_mutated = 0, st_valid = 0;
  std::map<std::string, int> messages;
  std::vector<std::pair<std::map<std::string, std::string>, std::string>> binary_cases;  // files, message
  Watchdog dog(kHangSeconds);
  for (int i = 0; i < n && !HasFailure(); ++i) {
    const size_t which = m.chance(0.6) ? 0 : m.chance(0.4) ? 1 : 2;
    std::map<std::string, std::string> files = f.dirs[which];
    std::vector<std::string> names;
    for (const auto& [name, bytes] : files) names.push_back(name);
    const std::string& target = m.pick(names);
    files[target] = mutate_hf_file(target, files[target], m);
    if (files[target] == f.dirs[which].at(target)) continue;  // nothing changed
    const std::string input = target + ": " + files[target];
    dog.tick(input);
    const std::string dir = f.write(files);
    fs::remove_all(out);
    const Outcome o = attempt([&] {
      import_hf({dir, out});
      // What import accepts, eval and sample can load.
      load_for_inference(out, "cpu", "", 1, 1);
    });
    if (!expect_ok_or_input_error(o, input)) break;
    imported += o.kind == Outcome::ok;
    if (target.find(".safetensors") != std::string::npos && target.find(".json") == std::string::npos) {
      ++st_mutated;
      st_valid += o.message.find("not a valid safetensors file") == std::string::npos;
    }
    if (o.kind == Outcome::rejected) {
      if (++messages[message_kind(o.message, f.scratch.path)] == 1 && binary_cases.size() < 6)
        binary_cases.emplace_back(files, o.message);
    }
  }
  if (HasFailure()) return;
  // Mutated weight files get past the format checks to the checks against config.json;
  // many ways to be rejected; data bytes (and harmless edits) import.
  EXPECT_GE(st_valid, st_mutated / 4) << "too few mutated safetensors files pass the format checks";
  EXPECT_GE(int(messages.size()), 25) << "too few distinct rejections";
  EXPECT_GE(imported, n / 30) << "too few mutated directories import";
  std::printf("[   FUZZ   ] hf import: %d inputs, %d of %d mutated weight files well-formed, %d imported, %zu distinct "
              "rejections\n", n, st_valid, st_mutated, imported, messages.size());

  // The same rejections from the real program.
  for (const auto& [files, message] : binary_cases) {
    const std::string dir = f.write(files);
    fs::remove_all(out);
    expect_binary_rejects("import " + dir + " --out " + out, f.scratch.path, message, message);
  }
}

// ---- the tokenizer -----------------------------------------------------------------

using test::shared_tokenizer;
using test::vocab_dir;

TEST(Fuzz, TokenizerDecodesAnyIds) {
  REQUIRE_TOKENIZER();
  std::mt19937_64 rng = test::test_rng();
  Mutator m(rng);
  const int V = tok->vocab_size();
  const std::vector<int32_t> bad = {-1, -2, INT32_MIN, INT32_MAX, V, V + 1, 50304, 65535, 65536};
  const int n = iterations(2000);
  Watchdog dog(kHangSeconds);
  for (int i = 0; i < n && !HasFailure(); ++i) {
    std::vector<int32_t> ids(m.below(24));
    bool valid = true;
    for (int32_t& id : ids) {
      if (m.chance(0.97)) id = int32_t(m.below(size_t(V)));
      else id = m.chance(0.5) ? m.pick(bad) : int32_t(rng()), valid &= id >= 0 && id < V;
    }
    std::string input;
    for (int32_t id : ids) input += std::to_string(id) + " ";
    dog.tick(input);
    std::string text;
    const Outcome o = attempt([&] { text = tok->decode(ids); });
    if (!expect_ok_or_input_error(o, input)) break;
    EXPECT_EQ(o.kind == Outcome::ok, valid) << "ids: " << input << o.message;
    if (o.kind == Outcome::ok) {
      std::string expected;
      for (int32_t id : ids) expected += tok->token_bytes(id);
      EXPECT_EQ(text, expected) << "ids: " << input;
    }
  }
}

// Bytes to encode: random bytes, random code points as UTF-8 (surrogates, overlong forms,
// values past U+10FFFF and cut sequences included), words, spaces, digits, punctuation,
// contractions, "<|endoftext|>", and long runs.
std::string random_text(Mutator& m) {
  const std::vector<std::string> pieces = {" ", "  ", "\n", "\t", "\r\n", "'s", "'ll", "'RE", "the", " The",
                                           "hello", "123", " 4567", "!!", "?", "<|endoftext|>", "<|endo",
                                           "é", "日本語", "🙂", "\u00a0", "\u3000", "\u0085", "\xc0\x80",
                                           "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82", "\x80", "\xff"};
  std::string s;
  for (size_t k = m.below(12); k > 0; --k) {
    switch (m.below(5)) {
      case 0: s += m.random_bytes(1 + m.below(12)); break;
      case 1: {  // a code point, encoded without checks
        const uint32_t cp = uint32_t(m.chance(0.5) ? m.below(0x800) : m.below(0x140000));
        if (cp < 0x80) s += char(cp);
        else if (cp < 0x800) s += {char(0xC0 | cp >> 6), char(0x80 | (cp & 63))};
        else if (cp < 0x10000) s += {char(0xE0 | cp >> 12), char(0x80 | (cp >> 6 & 63)), char(0x80 | (cp & 63))};
        else s += {char(0xF0 | (cp >> 18 & 7)), char(0x80 | (cp >> 12 & 63)), char(0x80 | (cp >> 6 & 63)),
                   char(0x80 | (cp & 63))};
        break;
      }
      case 2: s += std::string(1 + m.below(m.chance(0.1) ? 3000 : 8), m.pick(std::vector<char>{' ', 'a', '1', '!', '\n', '\xe3'})); break;
      default: s += m.pick(pieces);
    }
  }
  return m.chance(0.3) ? m.bytes(s) : s;
}

// The vocabulary files (`--vocab DIR`): encoder.json edited by structure (an id changed,
// a token removed, added or renamed) or byte by byte, vocab.bpe by lines or bytes. Slow
// (each load parses 1 MB of JSON), so CI runs few.
TEST(Fuzz, TokenizerFiles) {
  REQUIRE_TOKENIZER();
  std::mt19937_64 rng = test::test_rng();
  Mutator m(rng);
  test::ScratchDir scratch("flashgpt_fuzz_vocab_");
  const std::string encoder = slurp(vocab_dir() + "/encoder.json"), merges = slurp(vocab_dir() + "/vocab.bpe");
  const json tokens = json::parse(encoder);
  const std::string text = "Hello, world! <|endoftext|> 12345 \xc3\xa9t\xc3\xa9\n\n  tabs\there";
  const int n = iterations(40);
  int parsed = 0, loaded = 0;
  Watchdog dog(kHangSeconds);
  for (int i = 0; i < n && !HasFailure(); ++i) {
    std::string enc = encoder, bpe = merges, input;
    if (m.chance(0.6)) {
      if (m.chance(0.75)) {
        json j = tokens;
        auto it = j.begin();
        std::advance(it, long(m.below(j.size())));
        const std::string key = it.key();
        switch (m.below(4)) {
          case 0: j[key] = m.value(j[key]); break;
          case 1: j.erase(key); break;
          case 2: j[m.bytes(key)] = m.value(j[key]); break;
          default: {  // renamed
            const json id = j[key];
            j.erase(key);
            j[m.bytes(key)] = id;
          }
        }
        enc = m.dump(j);
        input = "encoder.json: " + key;
      } else {
        enc = m.bytes(encoder);
        input = "encoder.json bytes";
      }
    } else {
      bpe = m.chance(0.5) ? m.lines(merges) : m.bytes(merges);
      input = "vocab.bpe";
    }
    if (enc == encoder && bpe == merges) continue;
    dog.tick(input);
    spit(scratch.path / "encoder.json", enc);
    spit(scratch.path / "vocab.bpe", bpe);
    std::vector<int32_t> ids;
    std::string back;
    const Outcome o = attempt([&] {
      Tokenizer t(scratch.path.string());
      ids = t.encode_with_special(text);
      back = t.decode(ids);
    });
    if (!expect_ok_or_input_error(o, input)) break;
    parsed += o.message.find("not valid JSON") == std::string::npos;
    if (o.kind == Outcome::ok) {
      ++loaded;
      EXPECT_EQ(back, text) << "a tokenizer that loaded does not round-trip; input: " << input;
    }
  }
  if (HasFailure()) return;
  EXPECT_GE(parsed, n / 2) << "too few mutated vocabularies get past the JSON syntax";
  std::printf("[   FUZZ   ] vocabulary files: %d inputs, %d past the JSON syntax, %d loaded\n", n, parsed, loaded);
}

TEST(Fuzz, TokenizerEncodesAnyBytes) {
  REQUIRE_TOKENIZER();
  std::mt19937_64 rng = test::test_rng();
  Mutator m(rng);
  const int n = iterations(1500);
  Watchdog dog(kHangSeconds);
  for (int i = 0; i < n && !HasFailure(); ++i) {
    const std::string text = random_text(m);
    dog.tick(text);
    // Byte-level BPE takes any bytes: nothing may throw, and decoding gives them back.
    std::vector<int32_t> ids, special;
    const Outcome o = attempt([&] {
      ids = tok->encode(text);
      special = tok->encode_with_special(text);
    });
    ASSERT_EQ(o.kind, Outcome::ok) << o.message << "\n  input: " << show(text);
    for (int32_t id : ids)
      ASSERT_TRUE(id >= 0 && id < tok->vocab_size() && id != Tokenizer::kEndOfText) << id << " from " << show(text);
    ASSERT_EQ(tok->decode(ids), text) << "encode then decode changed the bytes: " << show(text);
    ASSERT_EQ(tok->decode(special), text) << "encode_with_special then decode changed the bytes: " << show(text);
    size_t markers = 0;
    for (size_t p = text.find(Tokenizer::kEndOfTextText); p != std::string::npos;
         p = text.find(Tokenizer::kEndOfTextText, p + Tokenizer::kEndOfTextText.size()))
      ++markers;
    ASSERT_EQ(size_t(std::count(special.begin(), special.end(), Tokenizer::kEndOfText)), markers) << show(text);
  }
}

// ---- regressions: one test per bug the fuzzer found --------------------------------

std::string input_error_of(const std::function<void()>& f) {
  const Outcome o = attempt(f);
  EXPECT_EQ(o.kind, Outcome::rejected) << (o.kind == Outcome::ok ? "accepted" : o.message);
  return o.message;
}

std::string config_error(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  test::ScratchDir scratch("flashgpt_fuzz_regression_");
  spit(scratch.path / "c.yaml", yaml);
  return input_error_of([&] { load_config(scratch.file("c.yaml"), sets); });
}

// Quoted input put a newline into a message, and "error: ..." became two lines.
TEST(FuzzRegression, InputErrorMessagesAreOneLine) {
  const std::string yaml = "train:\n  beta2: \"0.9\\n5\"\n";  // the value is "0.9<newline>5"
  EXPECT_EQ(config_error(yaml), "config key 'train.beta2': expected a number, got '0.9\\n5'");
  EXPECT_EQ(config_error("", {"run.device=\"a\\tb\\u0001\""}),
            "config key 'run.device': must be auto, cpu or cuda, got 'a\\tb\\x01'");
  test::ScratchDir scratch("flashgpt_fuzz_regression_");
  spit(scratch.path / "c.yaml", yaml);
  expect_binary_rejects("train -c " + scratch.file("c.yaml"), scratch.path,
                        "config key 'train.beta2': expected a number, got '0.9\\n5'", yaml);
}

// A corrupt safetensors header's bytes reached the message raw (the JSON parser quotes
// what it last read), and the terminal got bytes that are not UTF-8. One byte of a
// sequence that is not well-formed is escaped; well-formed ones at the table's edges stay.
TEST(FuzzRegression, InputErrorMessagesAreUtf8) {
  const std::string kept = "a \xc2\x80 \xdf\xbf \xe0\xa0\x80 \xed\x9f\xbf \xee\x80\x80 \xf0\x90\x80\x80 \xf4\x8f\xbf\xbf";
  EXPECT_EQ(InputError(kept).what(), kept);
  EXPECT_TRUE(is_utf8(kept));
  const std::pair<const char*, const char*> escaped[] = {
      {"\xc0\x80", "\\xc0\\x80"},                  // an overlong NUL
      {"\xe0\x9f\xbf", "\\xe0\\x9f\\xbf"},          // an overlong three-byte form
      {"\xed\xa0\x80", "\\xed\\xa0\\x80"},          // a surrogate
      {"\xf4\x90\x80\x80", "\\xf4\\x90\\x80\\x80"},  // past U+10FFFF
      {"\xf5\x80", "\\xf5\\x80"},                  // no lead byte
      {"a\xe2\x82" "b", "a\\xe2\\x82b"},             // cut short
      {"\x80\xc3\xa9", "\\x80\xc3\xa9"},             // a lone continuation byte, then U+00E9
      {"\xff\xfe", "\\xff\\xfe"}};
  for (const auto& [raw, shown] : escaped) {
    EXPECT_EQ(std::string(InputError(raw).what()), shown) << show(raw);
    EXPECT_TRUE(is_utf8(InputError(raw).what())) << show(raw);
  }
  // Through `flashgpt import`: a byte of a key ("dtype") in the header made 0xff.
  HfFixture f;
  std::map<std::string, std::string> files = f.dirs[0];
  Packed st = Packed::split(files.at("model.safetensors"), 0);
  st.header[st.header.find("\"dtype\"") + 2] = '\xff';
  files["model.safetensors"] = st.join();
  const std::string dir = f.write(files), out = f.scratch.file("out");
  const std::string message = input_error_of([&] { import_hf({dir, out}); });
  EXPECT_NE(message.find("\"d\\xff"), std::string::npos) << show(message);
  EXPECT_TRUE(is_utf8(message)) << show(message);
  fs::remove_all(out);
  expect_binary_rejects("import " + dir + " --out " + out, f.scratch.path, message, message);
}

// CLI11's own parse errors quoted the argument raw: a newline in it split the message
// and a byte that is not UTF-8 reached the terminal as it was.
TEST(FuzzRegression, CommandLineErrorsAreOneLineOfUtf8) {
  test::ScratchDir scratch("flashgpt_fuzz_cli_");
  const std::string hint = "\nRun with --help or --help-all for more information.\n";
  const std::pair<const char*, const char*> cases[] = {  // arguments, the escaped part of the message
      {"train --bogus 'a\nb\xff'", "a\\nb\\xff"},
      {"eval x --seq-len 'a\tb\xfe'", "a\\tb\\xfe"},
      {"sample", "checkpoint is required"}};
  for (const auto& [args, escaped] : cases) {
    auto [status, err] = run_binary(args, scratch.path);
    EXPECT_EQ(status, 2) << args;
    EXPECT_TRUE(is_utf8(err)) << show(err);
    ASSERT_GT(err.size(), hint.size()) << show(err);
    EXPECT_EQ(err.rfind("error: ", 0), 0u) << show(err);
    EXPECT_EQ(err.substr(err.size() - hint.size()), hint) << show(err);
    EXPECT_EQ(err.find('\n'), err.size() - hint.size()) << "the message is not one line: " << show(err);
    EXPECT_NE(err.find(escaped), std::string::npos) << show(err);
  }
}

// A key that is a mapping ("? {a: 1}") threw yaml-cpp's bad conversion (exit 1).
TEST(FuzzRegression, ConfigKeysAreNamesAndSectionsAreMappings) {
  EXPECT_EQ(config_error("? {a: 1}\n: 2\n"), "config: a key is a mapping, not a name");
  EXPECT_EQ(config_error("train:\n  ? [lr, eps]\n  : 1\n"), "config section 'train': a key is a list, not a name");
  EXPECT_EQ(config_error("train: 5\n"), "config key 'train': expected a mapping of keys, got a value");
  EXPECT_EQ(config_error("train:\nmodel:\n  n_layer: 2\n"), "config key 'train': expected a mapping of keys, got nothing");
  EXPECT_EQ(config_error("train:\n  lr:\n"), "config key 'train.lr': expected a number, got nothing");
}

// eps: .inf loaded as inf; the resolved config saved with the run said "inf", which
// does not read back, so eval and resume of that run failed.
TEST(FuzzRegression, NonFiniteConfigNumbersAreRejected) {
  for (const char* v : {".inf", "-.inf", "+.Inf", ".NaN", ".nan"}) {
    EXPECT_EQ(config_error(std::string("train:\n  eps: ") + v + "\n"),
              std::string("config key 'train.eps': expected a finite number, got '") + v + "'");
    EXPECT_EQ(config_error("", {std::string("train.lr=") + v}),
              std::string("config key 'train.lr': expected a finite number, got '") + v + "'");
  }
}

// Writes `files` with `name` changed by `change` and checksums.json recomputed.
void write_changed(CheckpointFixture& f, const std::string& name, const std::function<void(std::string&)>& change) {
  std::map<std::string, std::string> files = f.files;
  change(files[name]);
  files["checksums.json"] = checksums_of(files);
  f.write(files);
}

void set_json(std::string& bytes, const std::string& pointer, const json& value) {
  json j = json::parse(bytes);
  j[json::json_pointer(pointer)] = value;
  bytes = j.dump();
}

void set_header(std::string& bytes, const std::string& pointer, const json& value) {
  Packed p = Packed::split(bytes);
  set_json(p.header, pointer, value);
  bytes = p.join();
}

// Integer fields were read with get<int>() / get<uint64_t>(): a step of 2.5 became 2,
// -1 and 1e300 went through undefined float-to-integer casts, a negative step was taken.
TEST(FuzzRegression, CheckpointIntegerFieldsAreStrict) {
  CheckpointFixture f;
  struct Case {
    const char* file;
    const char* pointer;
    json value;
    const char* field;  // named in the message
  };
  const std::vector<Case> cases = {
      {"state.json", "/step", -1, "'step'"},       {"state.json", "/step", 2.5, "'step'"},
      {"state.json", "/step", 1e300, "'step'"},    {"state.json", "/step", "3", "'step'"},
      {"state.json", "/step", int64_t(1) << 31, "'step'"},
      {"state.json", "/loader/rows", 1e300, "'rows'"},  {"state.json", "/loader/rows", 1.5, "'rows'"},
      {"state.json", "/loader/epoch", -1, "'epoch'"},   {"state.json", "/loader/version", 2.0, "'version'"},
      {"state.json", "/loader/shards/0/tokens", 400.0, "'tokens'"},
      {"model.bin", "/numel", -1, "'numel'"},      {"model.bin", "/numel", 1e300, "'numel'"},
      {"model.bin", "/params/0/offset", 0.5, "'offset'"}, {"model.bin", "/params/1/offset", -8, "'offset'"},
      {"optimizer.bin", "/step", -3, "'step'"},    {"optimizer.bin", "/numel", 1e19, "'numel'"}};
  for (const Case& c : cases) {
    write_changed(f, c.file, [&](std::string& b) {
      if (std::string(c.file) == "state.json") set_json(b, c.pointer, c.value);
      else set_header(b, c.pointer, c.value);
    });
    const std::string message = input_error_of([&] { f.load(); });
    EXPECT_NE(message.find(c.field), std::string::npos) << c.file << c.pointer << " = " << c.value.dump() << ": " << message;
  }
  f.write(f.files);
  EXPECT_NO_THROW(f.load());
}

// A value nested 100000 deep parsed, then overflowed the stack where it was copied (the
// loader state of state.json) or printed (a tensor's name in a message).
TEST(FuzzRegression, DeeplyNestedJsonIsRejected) {
  CheckpointFixture f;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  auto nest = [&](std::string& bytes, const std::string& pointer) {
    json j = json::parse(bytes);
    j[json::json_pointer(pointer)] = kDeep;
    bytes = j.dump();
    const std::string placeholder = json(kDeep).dump();
    bytes.replace(bytes.find(placeholder), placeholder.size(), deep);
  };
  write_changed(f, "state.json", [&](std::string& b) { nest(b, "/loader/seed"); });
  EXPECT_EQ(input_error_of([&] { f.load(); }), (fs::path(f.ckpt) / "state.json").string() +
                                                    " is nested more than 64 levels deep");
  write_changed(f, "model.bin", [&](std::string& b) {
    Packed p = Packed::split(b);
    nest(p.header, "/params/0/name");
    b = p.join();
  });
  EXPECT_EQ(input_error_of([&] { f.load(); }), (fs::path(f.ckpt) / "model.bin").string() +
                                                    " is nested more than 64 levels deep");
}

// The checkpoint's config.yaml was parsed before any checksum was checked: a damaged one
// sized the model (n_embd 8 -> 8000000 allocates gigabytes) before the weights' checksum
// failed, or failed as "not valid YAML" instead of as a damaged checkpoint.
TEST(FuzzRegression, CheckpointConfigIsVerifiedBeforeUse) {
  CheckpointFixture f;
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"n_embd: 8", "n_embd: 8000000"},
                                                                                 {"model:", "model: ["}}) {
    std::string yaml = f.files.at("config.yaml");
    ASSERT_NE(yaml.find(from), std::string::npos);
    yaml.replace(yaml.find(from), from.size(), to);
    spit(fs::path(f.ckpt) / "config.yaml", yaml);
    const std::string message = input_error_of([&] { load_checkpoint_config(f.ckpt); });
    EXPECT_NE(message.find("config.yaml does not match its checksum"), std::string::npos) << message;
  }
  f.write(f.files);
  EXPECT_EQ(config_to_yaml(load_checkpoint_config(f.ckpt)), config_to_yaml(f.cfg));
}

// `latest` was followed wherever it pointed, a temporary (interrupted) save included.
TEST(FuzzRegression, LatestMustNameACompleteCheckpoint) {
  CheckpointFixture f;
  fs::copy(f.ckpt, f.ckpt + ".tmp", fs::copy_options::recursive);  // looks complete, but its save never finished
  const std::string latest = f.run_dir + "/latest";
  for (const char* name : {"ckpt_000003.tmp", "\nckpt_000003", "../run", "/tmp", "ckpt_000099", "", "."}) {
    spit(latest, std::string(name) + "\n");
    const std::string message = input_error_of([&] { resolve_checkpoint(f.run_dir); });
    EXPECT_EQ(message.find("'" + latest + "' names '"), 0u) << message;
    EXPECT_NE(message.find("which is not a complete checkpoint directory"), std::string::npos) << message;
  }
  spit(latest, "ckpt_000003\n");
  EXPECT_EQ(resolve_checkpoint(f.run_dir), f.ckpt);
}

}  // namespace
}  // namespace flashgpt

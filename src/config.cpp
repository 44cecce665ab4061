// Config loading: a table of bindings (path → typed field) drives parsing, overrides,
// printing and unknown-key detection, so each key is named exactly once.
#include "src/config.h"
#include <charconv>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include "layers/recompute.h"
#include "src/errors.h"

namespace flashgpt {
namespace {

struct Binding {
  std::function<void(const YAML::Node&, const std::string& path)> set;
  std::function<YAML::Node()> get;
};

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, std::string>) return "a string";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else return "an integer";
}

// What a YAML node is, for messages.
const char* node_kind(const YAML::Node& n) {
  return n.IsMap() ? "a mapping" : n.IsSequence() ? "a list" : n.IsNull() ? "nothing" : "a value";
}

template <class T>
Binding bind(T& field) {
  Binding b;
  b.set = [&field](const YAML::Node& n, const std::string& path) {
    if (!n.IsScalar()) fail_input("config key '", path, "': expected ", type_name<T>(), ", got ", node_kind(n));
    T v{};
    try {
      v = n.as<T>();
    } catch (const YAML::Exception&) {
      fail_input("config key '", path, "': expected ", type_name<T>(), ", got '", n.Scalar(), "'");
    }
    if constexpr (std::is_floating_point_v<T>) {
      // No key takes inf or nan (1e999 reads as inf), and the resolved config that runs
      // and checkpoints save would print them as "inf", which does not read back.
      if (!std::isfinite(v)) fail_input("config key '", path, "': expected a finite number, got '", n.Scalar(), "'");
    }
    if constexpr (std::is_integral_v<T>) {
      // yaml-cpp reads "1.5" as int 1 in some versions: insist on an integer literal.
      const std::string& s = n.Scalar();
      if (s.find_first_of(".eE") != std::string::npos && s.rfind("0x", 0) != 0)
        fail_input("config key '", path, "': expected an integer, got '", s, "'");
    }
    field = v;
  };
  b.get = [&field]() {
    if constexpr (std::is_floating_point_v<T>) {  // shortest text that reads back exactly
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof buf, field);
      return YAML::Node(std::string(buf, r.ptr));
    } else {
      return YAML::Node(field);
    }
  };
  return b;
}

std::map<std::string, Binding> bindings(Config& c) {
  std::map<std::string, Binding> m;
  m["model.n_layer"] = bind(c.model.n_layer);
  m["model.n_head"] = bind(c.model.n_head);
  m["model.n_embd"] = bind(c.model.n_embd);
  m["model.vocab_size"] = bind(c.model.vocab_size);
  m["model.padded_vocab"] = bind(c.model.padded_vocab);
  m["model.max_seq_len"] = bind(c.model.max_seq_len);
  m["model.attention"] = bind(c.model.attention);
  m["model.position"] = bind(c.model.position);
  m["train.batch_size"] = bind(c.train.batch_size);
  m["train.seq_len"] = bind(c.train.seq_len);
  m["train.total_batch"] = bind(c.train.total_batch);
  m["train.lr"] = bind(c.train.lr);
  m["train.warmup_steps"] = bind(c.train.warmup_steps);
  m["train.schedule"] = bind(c.train.schedule);
  m["train.min_lr_frac"] = bind(c.train.min_lr_frac);
  m["train.weight_decay"] = bind(c.train.weight_decay);
  m["train.beta1"] = bind(c.train.beta1);
  m["train.beta2"] = bind(c.train.beta2);
  m["train.eps"] = bind(c.train.eps);
  m["train.grad_clip"] = bind(c.train.grad_clip);
  m["train.steps"] = bind(c.train.steps);
  m["train.eval_every"] = bind(c.train.eval_every);
  m["train.eval_steps"] = bind(c.train.eval_steps);
  m["train.log_every"] = bind(c.train.log_every);
  m["train.checkpoint_every"] = bind(c.train.checkpoint_every);
  m["train.keep_checkpoints"] = bind(c.train.keep_checkpoints);
  m["train.nonfinite"] = bind(c.train.nonfinite);
  m["train.nonfinite_limit"] = bind(c.train.nonfinite_limit);
  m["train.seed"] = bind(c.train.seed);
  m["train.precision"] = bind(c.train.precision);
  m["train.zero"] = bind(c.train.zero);
  m["train.init_from"] = bind(c.train.init_from);
  m["train.recompute"] = bind(c.train.recompute);
  m["data.train"] = bind(c.data.train);
  m["data.val"] = bind(c.data.val);
  m["run.out_dir"] = bind(c.run.out_dir);
  m["run.device"] = bind(c.run.device);
  return m;
}

void apply(std::map<std::string, Binding>& m, const YAML::Node& node, const std::string& prefix) {
  if (!node.IsMap()) fail_input("config", prefix.empty() ? "" : " key '" + prefix + "'", ": expected a mapping");
  for (const auto& kv : node) {
    // A key is a name; YAML also allows a list or a mapping as a key ("? [a, b]: 1").
    if (!kv.first.IsScalar())
      fail_input("config", prefix.empty() ? "" : " section '" + prefix + "'", ": a key is ", node_kind(kv.first),
                 ", not a name");
    const std::string& key = kv.first.Scalar();
    std::string path = prefix.empty() ? key : prefix + "." + key;
    bool is_section = false;
    for (const auto& [p, b] : m) is_section |= p.rfind(path + ".", 0) == 0;
    if (is_section) {
      if (!kv.second.IsMap()) fail_input("config key '", path, "': expected a mapping of keys, got ", node_kind(kv.second));
      apply(m, kv.second, path);
      continue;
    }
    auto it = m.find(path);
    if (it == m.end()) fail_input("unknown config key '", path, "'");
    it->second.set(kv.second, path);
  }
}

void check(bool ok, const char* path, const std::string& why) {
  if (!ok) fail_input("config key '", path, "': ", why);
}

}  // namespace

void validate_config(const Config& c) {
  const auto& m = c.model;
  const auto& t = c.train;
  check(m.n_layer >= 1, "model.n_layer", "must be >= 1");
  check(m.n_head >= 1, "model.n_head", "must be >= 1");
  check(m.n_embd >= 1, "model.n_embd", "must be >= 1");
  check(m.n_embd % m.n_head == 0, "model.n_embd",
        cat("must be divisible by model.n_head (", m.n_embd, " % ", m.n_head, " != 0)"));
  // The GPU kernels move 16 bytes (8 bf16) at a time along channels and vocabulary.
  check(m.n_embd % 8 == 0, "model.n_embd", cat("must be a multiple of 8 (", m.n_embd, ")"));
  check(m.vocab_size >= 2, "model.vocab_size", "must be >= 2");
  check(m.padded_vocab >= m.vocab_size, "model.padded_vocab", "must be >= model.vocab_size");
  check(m.padded_vocab % 8 == 0, "model.padded_vocab", cat("must be a multiple of 8 (", m.padded_vocab, ")"));
  check(m.max_seq_len >= 1, "model.max_seq_len", "must be >= 1");
  check(m.attention == "flash" || m.attention == "naive", "model.attention",
        "must be 'flash' or 'naive', got '" + m.attention + "'");
  check(m.position == "learned" || m.position == "rope", "model.position",
        "must be 'learned' or 'rope', got '" + m.position + "'");
  check(m.position == "learned" || (m.n_embd / m.n_head) % 2 == 0, "model.position",
        cat("rope needs an even head dim, got n_embd / n_head = ", m.n_embd / m.n_head));
  check(t.batch_size >= 1, "train.batch_size", "must be >= 1");
  check(t.seq_len >= 1, "train.seq_len", "must be >= 1");
  check(t.seq_len <= m.max_seq_len, "train.seq_len",
        cat("must be <= model.max_seq_len (", t.seq_len, " > ", m.max_seq_len, ")"));
  check(t.total_batch >= 0, "train.total_batch", "must be >= 0");
  check(t.lr >= 0, "train.lr", "must be >= 0");
  check(t.warmup_steps >= 0, "train.warmup_steps", "must be >= 0");
  check(t.schedule == "cosine" || t.schedule == "linear" || t.schedule == "constant",
        "train.schedule", "must be cosine, linear or constant, got '" + t.schedule + "'");
  check(t.min_lr_frac >= 0 && t.min_lr_frac <= 1, "train.min_lr_frac", "must be in [0, 1]");
  check(t.weight_decay >= 0, "train.weight_decay", "must be >= 0");
  check(t.beta1 >= 0 && t.beta1 < 1, "train.beta1", "must be in [0, 1)");
  check(t.beta2 >= 0 && t.beta2 < 1, "train.beta2", "must be in [0, 1)");
  check(t.eps > 0, "train.eps", "must be > 0");
  check(t.grad_clip >= 0, "train.grad_clip", "must be >= 0");
  check(t.steps >= 0, "train.steps", "must be >= 0");
  check(t.eval_every >= 0, "train.eval_every", "must be >= 0");
  check(t.eval_steps >= 0, "train.eval_steps", "must be >= 0");
  check(t.log_every >= 1, "train.log_every", "must be >= 1");
  check(t.checkpoint_every >= 0, "train.checkpoint_every", "must be >= 0");
  check(t.keep_checkpoints >= 0, "train.keep_checkpoints", "must be >= 0");
  check(t.nonfinite == "abort" || t.nonfinite == "skip", "train.nonfinite",
        "must be abort or skip, got '" + t.nonfinite + "'");
  check(t.nonfinite_limit >= 1, "train.nonfinite_limit", "must be >= 1");
  check(t.precision == "auto" || t.precision == "bf16" || t.precision == "fp32" || t.precision == "fp64",
        "train.precision", "must be auto, bf16, fp32 or fp64, got '" + t.precision + "'");
  check(t.zero == 0 || t.zero == 1, "train.zero", cat("must be 0 or 1, got ", t.zero));
  try {
    RecomputePolicy::parse(t.recompute);
  } catch (const InputError& e) {
    fail_input("config key 'train.recompute': ", e.what());
  }
  check(c.run.device == "auto" || c.run.device == "cpu" || c.run.device == "cuda", "run.device",
        "must be auto, cpu or cuda, got '" + c.run.device + "'");
  check(!c.run.out_dir.empty(), "run.out_dir", "must not be empty");
  if (t.precision == "bf16" || (t.precision == "auto" && c.run.device == "cuda")) validate_bf16_model(c);
}

void validate_bf16_model(const Config& c) {
  const auto& m = c.model;
  const int head_dim = m.n_embd / m.n_head;
  check(m.attention != "flash" || head_dim == 64 || head_dim == 128, "model.n_head",
        cat("bf16 FlashAttention needs a head dim (n_embd / n_head) of 64 or 128, got ", m.n_embd,
            " / ", m.n_head, " = ", head_dim));
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config c;
  auto m = bindings(c);
  if (!path.empty()) {
    YAML::Node root;
    try {
      root = YAML::LoadFile(path);
    } catch (const YAML::BadFile&) {
      fail_input("cannot read config file '", path, "'");
    } catch (const YAML::Exception& e) {
      fail_input("config file '", path, "' is not valid YAML: ", e.what());
    }
    if (!root.IsNull()) apply(m, root, "");
  }
  for (const std::string& o : overrides) {
    auto eq = o.find('=');
    if (eq == std::string::npos || eq == 0) fail_input("--set expects key=value, got '", o, "'");
    std::string key = o.substr(0, eq), value = o.substr(eq + 1);
    auto it = m.find(key);
    if (it == m.end()) fail_input("unknown config key '", key, "' in --set");
    YAML::Node n;
    try {
      n = YAML::Load(value);
    } catch (const YAML::Exception&) {
      fail_input("--set ", key, ": cannot parse value '", value, "'");
    }
    if (n.IsNull()) n = YAML::Node(value);
    it->second.set(n, key);
  }
  validate_config(c);
  return c;
}

std::string config_to_yaml(const Config& c) {
  Config copy = c;
  auto m = bindings(copy);
  YAML::Node root;
  for (auto& [path, b] : m) {
    auto dot = path.find('.');
    root[path.substr(0, dot)][path.substr(dot + 1)] = b.get();
  }
  YAML::Emitter out;
  out << root;
  return std::string(out.c_str()) + "\n";
}

}  // namespace flashgpt

// Run configuration: typed structs loaded from YAML (configs/*.yaml) plus --set
// overrides. Every key has its default written once, here, with a comment.
// Unknown keys, wrong types and out-of-range values are InputErrors naming the key's
// full path (e.g. "train.lr").
#pragma once
#include <string>
#include <vector>
#include <yaml-cpp/yaml.h>

namespace flashgpt {

struct Config {
  struct Model {
    int n_layer = 2;              // transformer blocks
    int n_head = 2;               // attention heads; head dim = n_embd / n_head
    int n_embd = 64;              // residual stream width
    int vocab_size = 50257;       // GPT-2 BPE vocabulary
    int padded_vocab = 50304;     // rows of wte (multiple of 128 for fast matmuls)
    int max_seq_len = 1024;       // rows of wpe
    std::string attention = "flash";  // flash (O(T) memory) | naive (stores T×T P)
    std::string position = "learned";  // learned (GPT-2's max_seq_len × n_embd table) | rope (rotary, no table)
  } model;
  struct Train {
    int batch_size = 4;           // micro-batch sequences per rank per step
    int seq_len = 64;             // tokens per sequence (<= model.max_seq_len)
    int total_batch = 0;          // tokens per optimizer step over all ranks; 0 = one micro-batch
    double lr = 1e-3;             // peak learning rate
    int warmup_steps = 10;        // linear warmup from 0 to lr
    std::string schedule = "cosine";  // cosine | linear | constant (after warmup)
    double min_lr_frac = 0.1;     // final lr = lr * min_lr_frac (cosine, linear)
    double weight_decay = 0.1;    // AdamW decoupled decay, 2-D weights only
    double beta1 = 0.9;           // AdamW first-moment decay
    double beta2 = 0.95;          // AdamW second-moment decay
    double eps = 1e-8;            // AdamW epsilon
    double grad_clip = 1.0;       // clip by global norm; 0 disables
    int steps = 200;              // optimizer steps
    int eval_every = 50;          // validation every N steps (and at the end); 0 = only at the end
    int eval_steps = 10;          // validation micro-batches per evaluation
    int log_every = 1;            // progress line every N steps
    int checkpoint_every = 0;     // checkpoint every N steps (and at the end); 0 = only at the end
    int keep_checkpoints = 0;     // keep only the newest N checkpoints; 0 = keep all
    std::string nonfinite = "abort";  // NaN/Inf loss or gradient norm: abort (no checkpoint) | skip the update
    int nonfinite_limit = 5;      // with skip: abort after this many non-finite steps in a row
    uint64_t seed = 1337;         // init and data order
    std::string precision = "auto";  // auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32 | fp64 (CPU)
    int zero = 1;                 // with several ranks: 1 shards AdamW state (master, m, v) over them
                                  // (ZeRO-1), 0 keeps all of it on every rank; no effect on one rank
    std::string init_from;        // checkpoint (or run dir) whose weights start a fresh run (fine-tuning); "" = random init
    std::string recompute = "none";  // what backward recomputes: none | gelu, ln, attn joined by '+' | block (layers/recompute.h)
  } train;
  struct Data {
    std::string train = "cache/shards/sotu/train_*.bin";  // glob of training shards
    std::string val = "cache/shards/sotu/val_*.bin";      // glob of validation shards
  } data;
  struct Run {
    std::string out_dir = "runs/tiny";  // metrics, resolved config, checkpoints
    std::string device = "auto";        // auto (CUDA if a GPU is visible) | cpu | cuda
  } run;
};

// Loads `path` (empty: defaults only), applies `overrides` ("train.lr=3e-4"), validates.
Config load_config(const std::string& path, const std::vector<std::string>& overrides);
// Resolved config as YAML text (every key, with its value).
std::string config_to_yaml(const Config& c);
// Throws InputError on out-of-range values or inconsistent keys.
void validate_config(const Config& c);
// What a bf16 run on the GPU needs of the model (FlashAttention's head dims). Checked by
// validate_config when the config asks for bf16 (train.precision bf16, or auto with
// run.device cuda); a caller that resolves precision auto to bf16 calls it then.
void validate_bf16_model(const Config& c);

}  // namespace flashgpt

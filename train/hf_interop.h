// Hugging Face GPT-2 interop: `flashgpt export CKPT --hf OUT_DIR` writes a directory
// that transformers.GPT2LMHeadModel.from_pretrained(OUT_DIR) loads as is; `flashgpt
// import HF_DIR --out DIR` turns a GPT-2 model.safetensors + config.json into a
// flashgpt checkpoint (eval, sample, train --init-from).
//
// The mapping: flashgpt's parameter names are GPT-2's (`h.3.attn.c_attn.weight`);
// HF's GPT2LMHeadModel prefixes them with `transformer.` and stores the four matmul
// weights of a block as Conv1D, (in, out) = the transpose of our nn.Linear (out, in).
// The LM head is tied to wte (HF writes no lm_head.weight); flashgpt's padded wte rows
// (vocab_size..padded_vocab) are dropped on export and zero on import.
#pragma once
#include <string>

namespace flashgpt {

struct ExportOptions {
  std::string checkpoint;  // checkpoint dir or run dir
  std::string out_dir;
  std::string dtype = "f32";  // f32 | bf16 | f64: the safetensors dtype
  std::string vocab;          // tokenizer dir to copy as vocab.json/merges.txt ("" = default, skipped if absent)
};
void export_hf(const ExportOptions& o);

struct ImportOptions {
  std::string hf_dir;   // config.json + model.safetensors (or model.safetensors.index.json + shards)
  std::string out_dir;  // a run directory: the checkpoint is out_dir/ckpt_000000, `latest` points at it
};
// Returns the checkpoint directory written.
std::string import_hf(const ImportOptions& o);

}  // namespace flashgpt

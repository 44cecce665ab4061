// `flashgpt bench decode`: times FlashDecoding (one query per sequence against a bf16 KV
// cache) and reports the KV read bandwidth; scripts/bench_decode.py compares it with
// PyTorch SDPA in the same run.
#pragma once
#include <CLI/CLI.hpp>

namespace flashgpt {
void add_bench_decode_command(CLI::App& bench);  // adds `decode` under `bench`
}

// `flashgpt bench train`: times whole training steps of a config's model on random
// tokens (no data needed), median of N steps after warm-up, with an optional per-op
// breakdown on the GPU.
#pragma once
#include <CLI/CLI.hpp>

namespace flashgpt {
void add_bench_train_command(CLI::App& bench);  // adds `train` under `bench`
void add_bench_comm_command(CLI::App& bench);   // adds `comm` under `bench` (train/bench_comm.cpp)
}

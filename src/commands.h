// Each folder adds its own subcommands to the one `flashgpt` program; main() only
// dispatches. A subcommand's callback throws InputError for bad input (exit 2).
#pragma once
#include <CLI/CLI.hpp>

namespace flashgpt {
void add_info_command(CLI::App& app);     // src/info.cpp
void add_train_commands(CLI::App& app);   // train/commands.cpp: train, eval
void add_data_commands(CLI::App& app);    // data/commands.cpp: prepare, encode, decode
void add_bench_commands(CLI::App& app);   // train/bench.cpp: bench attention, ...
void add_sample_command(CLI::App& app);   // train/sample.cpp: sample
void add_interop_commands(CLI::App& app); // train/hf_interop.cpp: export, import (Hugging Face)
void add_memory_command(CLI::App& app);   // train/memory.cpp: memory (plan, --measure, --plot)
}  // namespace flashgpt

// Temporary: the benchmark subcommands (bench attention, ...) replace this file.
#include "src/commands.h"
namespace flashgpt {
void add_bench_commands(CLI::App&) {}
}  // namespace flashgpt

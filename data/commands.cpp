// Temporary: the data issue (tokenizer, prepare, encode, decode) replaces this file.
#include "src/commands.h"
namespace flashgpt {
void add_data_commands(CLI::App&) {}
}  // namespace flashgpt

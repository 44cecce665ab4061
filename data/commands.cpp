// The data subcommands: prepare (text -> token shards), encode, decode (stdin -> stdout).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "data/prepare.h"
#include "data/tokenizer.h"
#include "src/commands.h"
#include "src/errors.h"

namespace flashgpt {

namespace {

std::string read_stdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

void write_stdout(const void* data, size_t bytes) {
  if (bytes && std::fwrite(data, 1, bytes, stdout) != bytes) fail("cannot write to stdout");
}

struct CodecOptions {
  std::string vocab = Tokenizer::default_dir();
  bool binary = false;        // uint16 little-endian ids instead of text
  bool one_per_line = false;  // text ids: one per line instead of space-separated
  bool special = false;       // encode: "<|endoftext|>" in the text is the special token
};

void run_encode(const CodecOptions& o) {
  Tokenizer tok(o.vocab);
  std::string text = read_stdin();
  std::vector<int32_t> ids = o.special ? tok.encode_with_special(text) : tok.encode(text);
  if (o.binary) {
    std::vector<uint16_t> packed(ids.begin(), ids.end());
    write_stdout(packed.data(), packed.size() * sizeof(uint16_t));
    return;
  }
  std::string out;
  const char separator = o.one_per_line ? '\n' : ' ';
  for (size_t i = 0; i < ids.size(); ++i) {
    out += std::to_string(ids[i]);
    out += (i + 1 == ids.size()) ? '\n' : separator;
  }
  write_stdout(out.data(), out.size());
}

void run_decode(const CodecOptions& o) {
  Tokenizer tok(o.vocab);
  std::string input = read_stdin();
  std::vector<int32_t> ids;
  if (o.binary) {
    if (input.size() % 2) fail_input("decode --binary: stdin has ", input.size(), " bytes, not a whole number of uint16 ids");
    for (size_t i = 0; i < input.size(); i += 2)
      ids.push_back(int32_t(uint8_t(input[i])) | (int32_t(uint8_t(input[i + 1])) << 8));
  } else {
    std::istringstream in(input);
    std::string word;
    while (in >> word) {
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size()) fail_input("decode: '", word, "' is not a token id (expected integers separated by whitespace)");
      if (id < 0 || id >= tok.vocab_size()) fail_input("decode: token id ", id, " is outside GPT-2's vocabulary [0, ", tok.vocab_size(), ")");
      ids.push_back(int32_t(id));
    }
  }
  std::string text = tok.decode(ids);
  write_stdout(text.data(), text.size());
}

void run_prepare(const PrepareOptions& o, const std::string& vocab) {
  Tokenizer tok(vocab);
  PrepareStats s = prepare_shards(o, tok);
  double mb = double(s.bytes) / 1e6;
  double tokens = double(s.train.tokens + s.val.tokens);
  std::fprintf(stderr,
               "prepare: %.1f MB -> train %zu docs, %zu tokens, %zu shard(s); val %zu docs, %zu tokens, %zu shard(s)\n"
               "prepare: %.2f s, %.1f MB/s, %.2fM tokens/s (%d threads, %.2fM tokens/s per thread) -> %s\n",
               mb, s.train.documents, s.train.tokens, s.train.shards, s.val.documents, s.val.tokens, s.val.shards,
               s.seconds, mb / s.seconds, tokens / 1e6 / s.seconds, s.threads, tokens / 1e6 / s.seconds / s.threads,
               o.out.c_str());
}

}  // namespace

void add_data_commands(CLI::App& app) {
  auto codec = std::make_shared<CodecOptions>();
  CLI::App* enc = app.add_subcommand("encode", "Text on stdin -> GPT-2 token ids on stdout");
  enc->add_option("--vocab", codec->vocab, "Directory with encoder.json and vocab.bpe (scripts/fetch_vocab.sh)")
      ->capture_default_str();
  enc->add_flag("--binary", codec->binary, "Write uint16 little-endian ids instead of text");
  enc->add_flag("--one-per-line", codec->one_per_line, "One id per line instead of space-separated");
  enc->add_flag("--special", codec->special, "Encode the text <|endoftext|> as the special token 50256");
  enc->callback([codec] { run_encode(*codec); });

  CLI::App* dec = app.add_subcommand("decode", "GPT-2 token ids on stdin (text or --binary uint16) -> text on stdout");
  dec->add_option("--vocab", codec->vocab, "Directory with encoder.json and vocab.bpe")->capture_default_str();
  dec->add_flag("--binary", codec->binary, "Read uint16 little-endian ids instead of text");
  dec->callback([codec] { run_decode(*codec); });

  auto prep = std::make_shared<PrepareOptions>();
  auto vocab = std::make_shared<std::string>(Tokenizer::default_dir());
  CLI::App* p = app.add_subcommand("prepare", "Text files -> token shards (train_*.bin, val_*.bin) for training");
  p->add_option("--input", prep->inputs, "Text files or directories of .txt files (documents separated by <|endoftext|> lines)")
      ->required();
  p->add_option("--out", prep->out, "Output directory, e.g. cache/shards/sotu")->required();
  p->add_option("--val-fraction", prep->val_fraction, "Share of documents for validation")->capture_default_str();
  p->add_option("--threads", prep->threads, "Encoding threads (0: all)")->capture_default_str();
  p->add_option("--shard-tokens", prep->shard_tokens, "Tokens per shard file")->capture_default_str();
  p->add_option("--vocab", *vocab, "Directory with encoder.json and vocab.bpe")->capture_default_str();
  p->add_flag("!--no-progress", prep->progress, "No progress bar");
  p->callback([prep, vocab] { run_prepare(*prep, *vocab); });
}

}  // namespace flashgpt

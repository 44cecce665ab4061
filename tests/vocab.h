// GPT-2's vocabulary for the tests that need the real tokenizer: where it is
// ($FLASHGPT_VOCAB_DIR, else cache/gpt2 of the source tree, from scripts/fetch_vocab.sh),
// loaded once per test binary.
#pragma once
#include <gtest/gtest.h>
#include <cstdlib>
#include <string>
#include "data/tokenizer.h"
#include "src/errors.h"

namespace flashgpt::test {

inline std::string vocab_dir() {
  const char* env = std::getenv("FLASHGPT_VOCAB_DIR");
  return env && *env ? env : std::string(FLASHGPT_SOURCE_DIR) + "/cache/gpt2";
}

// Loaded once; nullptr (and every test using REQUIRE_TOKENIZER fails) when missing.
inline const Tokenizer* shared_tokenizer() {
  static const Tokenizer* tok = []() -> const Tokenizer* {
    try {
      return new Tokenizer(vocab_dir());
    } catch (const InputError&) {
      return nullptr;
    }
  }();
  return tok;
}

}  // namespace flashgpt::test

// Declares `tok`, the shared tokenizer, or fails the test naming what to run.
#define REQUIRE_TOKENIZER()                                                                  \
  const ::flashgpt::Tokenizer* tok = ::flashgpt::test::shared_tokenizer();                   \
  ASSERT_NE(tok, nullptr) << "GPT-2 vocabulary not found in " << ::flashgpt::test::vocab_dir() \
                          << ": run scripts/fetch_vocab.sh (or set FLASHGPT_VOCAB_DIR)";

// GPT-2 BPE tokenizer: golden ids from js-tiktoken (tests/golden/gpt2.json, made by
// scripts/corpus/make_golden.mjs), exact byte round trips, fuzzing, pre-token rules.
// Needs GPT-2's vocabulary: scripts/fetch_vocab.sh (or $FLASHGPT_VOCAB_DIR).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "data/pretokenize.h"
#include "data/tokenizer.h"
#include "src/errors.h"

namespace fs = std::filesystem;
using namespace flashgpt;

namespace {

std::string vocab_dir() {
  const char* env = std::getenv("FLASHGPT_VOCAB_DIR");
  return env && *env ? env : std::string(FLASHGPT_SOURCE_DIR) + "/cache/gpt2";
}

// Loaded once; nullptr (and every test using it fails) when the files are missing.
const Tokenizer* tokenizer() {
  static const Tokenizer* tok = [] () -> const Tokenizer* {
    try {
      return new Tokenizer(vocab_dir());
    } catch (const InputError&) {
      return nullptr;
    }
  }();
  return tok;
}

#define REQUIRE_TOKENIZER()                                                                     \
  const Tokenizer* tok = tokenizer();                                                           \
  ASSERT_NE(tok, nullptr) << "GPT-2 vocabulary not found in " << vocab_dir()                    \
                          << ": run scripts/fetch_vocab.sh (or set FLASHGPT_VOCAB_DIR)";

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string> out;
  for_each_pretoken(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6)), s += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += char(0xE0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xF0 | (cp >> 18)), s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F)), s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

TEST(Tokenizer, GoldenIdsMatchJsTiktoken) {
  REQUIRE_TOKENIZER();
  std::ifstream f(std::string(FLASHGPT_SOURCE_DIR) + "/tests/golden/gpt2.json");
  ASSERT_TRUE(f) << "tests/golden/gpt2.json missing";
  nlohmann::json golden = nlohmann::json::parse(f);
  ASSERT_GE(golden["cases"].size(), 200u);
  for (const auto& c : golden["cases"]) {
    std::string text = from_hex(c["hex"]);
    std::vector<int32_t> expected = c["ids"];
    std::vector<int32_t> got = c["special"].get<bool>() ? tok->encode_with_special(text) : tok->encode(text);
    EXPECT_EQ(got, expected) << "case " << c["name"].get<std::string>();
    EXPECT_EQ(tok->decode(expected), text) << "case " << c["name"].get<std::string>();
  }
}

TEST(Tokenizer, KnownSentence) {
  REQUIRE_TOKENIZER();
  // GPT-2's ids for "Hello world", as published in countless tutorials.
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->decode({Tokenizer::kEndOfText}), "<|endoftext|>");
  // Ordinary encoding never produces the special token.
  std::vector<int32_t> ids = tok->encode("<|endoftext|>");
  EXPECT_GT(ids.size(), 1u);
  EXPECT_EQ(tok->decode(ids), "<|endoftext|>");
}

TEST(Tokenizer, RandomBytesRoundTrip) {
  REQUIRE_TOKENIZER();
  std::mt19937 rng(std::random_device{}());
  const std::string ascii_heavy = " \n\t'aesrtAZ09.,!?";
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(rng() % 200, '\0');
    for (char& ch : s) ch = (rng() % 2) ? char(rng() % 256) : ascii_heavy[rng() % ascii_heavy.size()];
    std::vector<int32_t> ids = tok->encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < Tokenizer::kEndOfText);
    ASSERT_EQ(tok->decode(ids), s) << "trial " << trial;
  }
}

TEST(Tokenizer, RandomUtf8FuzzRoundTrips) {
  REQUIRE_TOKENIZER();
  std::mt19937 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    std::string s;
    int n = int(rng() % 100);
    for (int i = 0; i < n; ++i) {
      uint32_t cp;
      switch (rng() % 4) {
        case 0: cp = rng() % 0x80; break;
        case 1: cp = rng() % 0x800; break;
        case 2: cp = rng() % 0x10000; break;
        default: cp = rng() % 0x110000; break;
      }
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = ' ';  // surrogates are not UTF-8
      s += utf8(cp);
    }
    std::string joined;
    for (const std::string& p : pieces(s)) {
      ASSERT_FALSE(p.empty());
      joined += p;
    }
    ASSERT_EQ(joined, s) << "pre-tokens must tile the text";
    ASSERT_EQ(tok->decode(tok->encode(s)), s) << "trial " << trial;
  }
}

TEST(Tokenizer, LongWhitespaceRunIsFastAndExact) {
  REQUIRE_TOKENIZER();
  std::string s = "a" + std::string(200000, ' ') + "b" + std::string(100000, '\n');
  auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = tok->encode(s);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tok->decode(ids), s);
  EXPECT_LT(seconds, 2.0) << "BPE must not be quadratic in the piece length";
}

TEST(Tokenizer, MissingOrWrongVocabIsAnInputError) {
  fs::path dir = fs::temp_directory_path() / ("fg_vocab_" + std::to_string(std::random_device{}()));
  fs::create_directories(dir);
  try {
    Tokenizer t(dir.string());
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find((dir / "encoder.json").string()), std::string::npos) << m;
    EXPECT_NE(m.find("scripts/fetch_vocab.sh"), std::string::npos) << m;
  }
  std::ofstream(dir / "encoder.json") << "{\"a\": 0, \"b\": 1}";
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\na b\n";
  EXPECT_THROW(Tokenizer t(dir.string()), InputError);
  fs::remove_all(dir);
}

TEST(Tokenizer, DecodeRejectsIdsOutsideTheVocab) {
  REQUIRE_TOKENIZER();
  EXPECT_THROW(tok->decode({50257}), InputError);
  EXPECT_THROW(tok->decode({-1}), InputError);
}

TEST(TokenizerPretokens, FollowGpt2Regex) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));  // the run gives its last space to "b"
  EXPECT_EQ(pieces("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("x  \n"), (V{"x", "  \n"}));  // at the end the run stays whole
  EXPECT_EQ(pieces("it's they'RE"), (V{"it", "'s", " they", "'", "RE"}));  // lower case only
  EXPECT_EQ(pieces("?'s"), (V{"?'", "s"}));
  EXPECT_EQ(pieces("abc123 456!!"), (V{"abc", "123", " 456", "!!"}));
  EXPECT_EQ(pieces("e\xCC\x81"), (V{"e", "\xCC\x81"}));  // a combining mark is not a letter
  // \s is Unicode White_Space: U+0085 is space, U+FEFF is not (JavaScript differs on both).
  EXPECT_EQ(char_class(0x85), CharClass::space);
  EXPECT_EQ(char_class(0xFEFF), CharClass::other);
  EXPECT_EQ(char_class(0x3000), CharClass::space);
  EXPECT_EQ(char_class(0x4E2D), CharClass::letter);  // 中
  EXPECT_EQ(char_class(0x2167), CharClass::number);  // Ⅷ (Nl)
  // Invalid UTF-8: each bad byte is one character of the "other" class.
  EXPECT_EQ(pieces("a\x80\x80 b\xE2\x82"), (V{"a", "\x80\x80", " b", "\xE2\x82"}));
  EXPECT_EQ(decode_utf8("\xC0\xAF", 0).code_point, kInvalidCodePoint);      // overlong '/'
  EXPECT_EQ(decode_utf8("\xED\xA0\x80", 0).code_point, kInvalidCodePoint);  // surrogate
  EXPECT_EQ(decode_utf8("\xF4\x90\x80\x80", 0).code_point, kInvalidCodePoint);  // > U+10FFFF
}

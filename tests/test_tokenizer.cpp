// GPT-2 BPE tokenizer: golden ids from js-tiktoken (tests/golden/gpt2.json, made by
// scripts/corpus/make_golden.mjs), fuzzing against an independent textbook BPE written
// here (ids, not only round trips), long runs checked for work that stays O(n log n),
// pre-token rules. Needs GPT-2's vocabulary: scripts/fetch_vocab.sh (or
// $FLASHGPT_VOCAB_DIR). Random inputs come from the test's seed (tests/testing.h).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "data/pretokenize.h"
#include "data/tokenizer.h"
#include "src/errors.h"
#include "tests/testing.h"
#include "tests/vocab.h"

namespace fs = std::filesystem;
using namespace flashgpt;

namespace {

using test::shared_tokenizer;
using test::vocab_dir;

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

// An independent GPT-2 BPE: the merge ranks read here from vocab.bpe, and the textbook
// algorithm — merge the adjacent pair of lowest rank (the leftmost on ties) until no
// pair has a rank — in O(n²) per piece, on the same pre-tokens.
class ReferenceBpe {
 public:
  explicit ReferenceBpe(const Tokenizer& tok) {
    for (int32_t id = 0; id < Tokenizer::kEndOfText; ++id) id_of_[tok.token_bytes(id)] = id;
    // GPT-2's byte stand-ins: printable Latin-1 bytes are themselves, the others map to
    // U+0100 onwards in byte order.
    std::vector<int> byte_of(512, -1);
    for (int b = 0, extra = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
      byte_of[printable ? b : 256 + extra++] = b;
    }
    auto bytes = [&](const std::string& s) {
      std::string out;
      for (size_t pos = 0; pos < s.size();) {
        Utf8Char c = decode_utf8(s, pos);
        out.push_back(char(byte_of.at(c.code_point)));
        pos += c.length;
      }
      return out;
    };
    std::ifstream f(vocab_dir() + "/vocab.bpe");
    std::string line;
    std::getline(f, line);  // #version
    for (int rank = 0; std::getline(f, line);) {
      if (line.empty()) continue;
      const size_t space = line.find(' ');
      merges_.emplace_back(bytes(line.substr(0, space)), bytes(line.substr(space + 1)));
      rank_[key(merges_.back().first, merges_.back().second)] = rank++;
    }
  }
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    for_each_pretoken(text, [&](std::string_view piece) {
      std::vector<std::string> parts;
      for (char c : piece) parts.emplace_back(1, c);
      for (;;) {
        size_t best = parts.size();
        int best_rank = 0;
        for (size_t i = 0; i + 1 < parts.size(); ++i) {
          auto it = rank_.find(key(parts[i], parts[i + 1]));
          if (it != rank_.end() && (best == parts.size() || it->second < best_rank)) best = i, best_rank = it->second;
        }
        if (best == parts.size()) break;
        parts[best] += parts[best + 1];
        parts.erase(parts.begin() + int64_t(best) + 1);
      }
      for (const std::string& p : parts) ids.push_back(id_of_.at(p));
    });
    return ids;
  }
  // The merges of vocab.bpe, in rank order: (left bytes, right bytes).
  const std::vector<std::pair<std::string, std::string>>& merges() const { return merges_; }

 private:
  static std::string key(const std::string& a, const std::string& b) { return std::to_string(a.size()) + ":" + a + b; }
  std::unordered_map<std::string, int32_t> id_of_;
  std::unordered_map<std::string, int> rank_;
  std::vector<std::pair<std::string, std::string>> merges_;
};

const ReferenceBpe& reference(const Tokenizer& tok) {
  static const ReferenceBpe ref(tok);
  return ref;
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

// Random bytes, half of them from a small ASCII set so that words and merges form:
// the ids are the reference BPE's, and decode gives the bytes back.
TEST(Tokenizer, RandomBytesMatchReferenceBpeAndRoundTrip) {
  REQUIRE_TOKENIZER();
  auto rng = test::test_rng();
  const std::string ascii_heavy = " \n\t'aesrtAZ09.,!?";
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(rng() % 200, '\0');
    for (char& ch : s) ch = (rng() % 2) ? char(rng() % 256) : ascii_heavy[rng() % ascii_heavy.size()];
    std::vector<int32_t> ids = tok->encode(s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < Tokenizer::kEndOfText);
    ASSERT_EQ(ids, reference(*tok).encode(s)) << "trial " << trial;
    ASSERT_EQ(tok->decode(ids), s) << "trial " << trial;
  }
}

TEST(Tokenizer, RandomUtf8MatchesReferenceBpeAndRoundTrips) {
  REQUIRE_TOKENIZER();
  auto rng = test::test_rng();
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
    std::vector<int32_t> ids = tok->encode(s);
    ASSERT_EQ(ids, reference(*tok).encode(s)) << "trial " << trial;
    ASSERT_EQ(tok->decode(ids), s) << "trial " << trial;
  }
}

// Rank order decides between overlapping pairs even for neighbouring ranks: wherever
// merge r is (a, b) and merge r + 1 is (c, a), the bytes c·a·b offer both pairs and
// (a, b) must go first. Every such case of GPT-2's merges is encoded like the reference.
TEST(Tokenizer, NeighbouringRanksAreOrdered) {
  REQUIRE_TOKENIZER();
  const auto& merges = reference(*tok).merges();
  ASSERT_EQ(merges.size(), 50000u);
  int cases = 0;
  for (size_t r = 0; r + 1 < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto& [c, d] = merges[r + 1];
    if (d != a) continue;
    const std::string s = c + a + b;
    ASSERT_EQ(tok->encode(s), reference(*tok).encode(s)) << "merges " << r << " and " << r + 1 << ": '" << s << "'";
    ++cases;
  }
  EXPECT_GT(cases, 0) << "no merge r + 1 ends with merge r's left token";
}

// Long runs of one class are one piece each (GPT-2 does not split digits): BPE on them
// must stay O(n log n). Counted as work (heap operations, Tokenizer::bpe_work), not
// seconds: doubling the run doubles the work (pushes and pops grow as n; their log n cost
// is not counted), where a quadratic BPE would quadruple it. The ids of a shorter run are the reference's.
TEST(Tokenizer, LongRunsAreExactAndTheirWorkGrowsAsNLogN) {
  REQUIRE_TOKENIZER();
  auto rng = test::test_rng();
  auto random_run = [&](const std::string& alphabet, size_t n) {
    std::string s(n, ' ');
    for (char& c : s) c = alphabet[rng() % alphabet.size()];
    return s;
  };
  struct Run {
    const char* name;
    std::function<std::string(size_t)> make;
  };
  const Run runs[] = {
      {"spaces and newlines", [](size_t n) { return "a" + std::string(n, ' ') + "b" + std::string(n / 2, '\n'); }},
      {"one letter", [](size_t n) { return std::string(n, 'a'); }},
      {"letters", [&](size_t n) { return random_run("etaoinshrdlucmfwyp", n); }},
      {"one digit", [](size_t n) { return " " + std::string(n, '7'); }},
      {"digits", [&](size_t n) { return random_run("0123456789", n); }},
  };
  for (const Run& run : runs) {
    SCOPED_TRACE(run.name);
    const std::string shorter = run.make(300);
    EXPECT_EQ(tok->encode(shorter), reference(*tok).encode(shorter));
    uint64_t work[2];
    for (int k = 0; k < 2; ++k) {
      const std::string s = run.make(size_t(50000) << k);
      const uint64_t before = Tokenizer::bpe_work();
      const std::vector<int32_t> ids = tok->encode(s);
      work[k] = Tokenizer::bpe_work() - before;
      EXPECT_EQ(tok->decode(ids), s);
    }
    EXPECT_GT(work[0], 25000u) << "no BPE work counted";
    EXPECT_LT(double(work[1]), 2.5 * double(work[0])) << "BPE work " << work[0] << " for n, " << work[1] << " for 2n";
  }
}

TEST(Tokenizer, MissingOrWrongVocabIsAnInputError) {
  test::ScratchDir scratch("fg_vocab_");
  const fs::path dir = scratch.path;
  test::expect_input_error([&] { Tokenizer t(dir.string()); }, {(dir / "encoder.json").string(), "scripts/fetch_vocab.sh"});
  std::ofstream(dir / "encoder.json") << "{\"a\": 0, \"b\": 1}";
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\na b\n";
  EXPECT_THROW(Tokenizer t(dir.string()), InputError);
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

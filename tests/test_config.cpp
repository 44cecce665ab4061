// Config loading: defaults, overrides, and one clear error for each bad-input class;
// the program exits with code 2 on bad input.
#include <gtest/gtest.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>
#include "optim/schedule.h"
#include "src/config.h"
#include "src/errors.h"
#include "tests/testing.h"

namespace flashgpt {
namespace {

std::string write_yaml(const std::string& text) {
  static int n = 0;
  // ctest runs tests as parallel processes: the pid keeps their files apart.
  std::string path = ::testing::TempDir() + "flashgpt_cfg_" + std::to_string(getpid()) + "_" +
                     std::to_string(n++) + ".yaml";
  std::ofstream(path) << text;
  return path;
}

// The InputError message for loading `yaml` with `sets`, or "" if it loads.
std::string error_of(const std::string& yaml, std::vector<std::string> sets = {}) {
  try {
    load_config(write_yaml(yaml), sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

// Every shipped config loads; the GPT-2 sizes are GPT-2's, and they run in bf16 on the
// GPU (head dim 64). The tiny config is the CPU default (head dim 16).
TEST(Config, LoadsEveryShippedConfig) {
  struct Shipped { const char* name; int n_layer, n_head, n_embd; bool bf16_ok; };
  for (const Shipped& s : {Shipped{"tiny", 4, 1, 64, true}, Shipped{"gpt2-124m", 12, 12, 768, true},
                           Shipped{"gpt2-350m", 24, 16, 1024, true}, Shipped{"gpt2-774m", 36, 20, 1280, true},
                           Shipped{"gpt2-124m-1m", 12, 12, 768, true}}) {
    SCOPED_TRACE(s.name);
    Config c = load_config(std::string(FLASHGPT_SOURCE_DIR) + "/configs/" + s.name + ".yaml", {});
    EXPECT_EQ(c.model.n_layer, s.n_layer);
    EXPECT_EQ(c.model.n_head, s.n_head);
    EXPECT_EQ(c.model.n_embd, s.n_embd);
    EXPECT_EQ(c.model.vocab_size, 50257);
    EXPECT_EQ(c.model.padded_vocab, 50304);
    if (s.bf16_ok) EXPECT_NO_THROW(validate_bf16_model(c));
    else EXPECT_THROW(validate_bf16_model(c), InputError);
  }
}

TEST(Config, OverridesAndRoundTrip) {
  Config c = load_config(write_yaml("train:\n  lr: 0.5\n"), {"train.lr=3e-4", "model.n_layer=3", "run.device=cpu"});
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.run.device, "cpu");
  // The resolved YAML loads back to the same values.
  Config d = load_config(write_yaml(config_to_yaml(c)), {});
  EXPECT_EQ(config_to_yaml(c), config_to_yaml(d));
  EXPECT_DOUBLE_EQ(d.train.lr, 3e-4);
}

TEST(Config, RejectsUnknownKeysWithTheirPath) {
  EXPECT_NE(error_of("train:\n  lrr: 1\n").find("unknown config key 'train.lrr'"), std::string::npos);
  EXPECT_NE(error_of("trian:\n  lr: 1\n").find("unknown config key 'trian'"), std::string::npos);
  EXPECT_NE(error_of("", {"model.foo=1"}).find("unknown config key 'model.foo'"), std::string::npos);
}

TEST(Config, RejectsWrongTypes) {
  EXPECT_NE(error_of("train:\n  lr: fast\n").find("'train.lr': expected a number, got 'fast'"), std::string::npos);
  EXPECT_NE(error_of("model:\n  n_layer: 2.5\n").find("'model.n_layer': expected an integer"), std::string::npos);
  EXPECT_NE(error_of("model:\n  n_layer: [1, 2]\n").find("'model.n_layer': expected an integer, got a list"), std::string::npos);
  EXPECT_NE(error_of("", {"train.steps=many"}).find("'train.steps'"), std::string::npos);
}

TEST(Config, RejectsOutOfRangeValues) {
  EXPECT_NE(error_of("model:\n  n_embd: 100\n  n_head: 3\n").find("'model.n_embd': must be divisible by model.n_head"), std::string::npos);
  EXPECT_NE(error_of("model:\n  max_seq_len: 32\ntrain:\n  seq_len: 64\n").find("'train.seq_len': must be <= model.max_seq_len"), std::string::npos);
  EXPECT_NE(error_of("train:\n  lr: -1\n").find("'train.lr': must be >= 0"), std::string::npos);
  EXPECT_NE(error_of("train:\n  schedule: sawtooth\n").find("'train.schedule'"), std::string::npos);
  EXPECT_NE(error_of("run:\n  device: tpu\n").find("'run.device'"), std::string::npos);
  EXPECT_NE(error_of("model:\n  vocab_size: 100\n  padded_vocab: 64\n").find("'model.padded_vocab'"), std::string::npos);
}

TEST(Config, PositionAndRecomputeKeys) {
  Config c = load_config(write_yaml("model:\n  position: rope\ntrain:\n  recompute: ln+gelu\n"), {});
  EXPECT_EQ(c.model.position, "rope");
  EXPECT_EQ(c.train.recompute, "ln+gelu");
  Config d = load_config("", {});
  EXPECT_EQ(d.model.position, "learned");
  EXPECT_EQ(d.train.recompute, "none");
  EXPECT_NE(error_of("model:\n  position: alibi\n").find("'model.position': must be 'learned' or 'rope'"), std::string::npos);
  EXPECT_NE(error_of("model:\n  n_embd: 24\n  n_head: 8\n  position: rope\n").find("'model.position': rope needs an even head dim"),
            std::string::npos);
  EXPECT_NE(error_of("train:\n  recompute: everything\n").find("'train.recompute': recompute policy 'everything': unknown part"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.recompute=block+gelu"}).find("'train.recompute'"), std::string::npos);
}

// What the GPU kernels need is checked at load (exit 2), not found by a kernel (exit 1):
// widths the 16-byte vector loads divide, and FlashAttention's head dims in bf16.
TEST(Config, RejectsWhatTheGpuKernelsCannotRun) {
  EXPECT_NE(error_of("model:\n  n_embd: 36\n  n_head: 2\n").find("'model.n_embd': must be a multiple of 8"), std::string::npos);
  EXPECT_NE(error_of("model:\n  vocab_size: 100\n  padded_vocab: 100\n").find("'model.padded_vocab': must be a multiple of 8"), std::string::npos);
  EXPECT_EQ(error_of("model:\n  vocab_size: 100\n  padded_vocab: 104\n"), "");
  const std::string head_dim_80 = "model:\n  n_embd: 160\n  n_head: 2\n";
  EXPECT_EQ(error_of(head_dim_80), "");  // precision auto, device auto: not known to be bf16
  EXPECT_EQ(error_of(head_dim_80, {"train.precision=fp32", "run.device=cuda"}), "");
  EXPECT_EQ(error_of(head_dim_80, {"train.precision=bf16", "model.attention=naive"}), "");
  for (auto sets : {std::vector<std::string>{"train.precision=bf16"}, {"run.device=cuda"}})
    EXPECT_NE(error_of(head_dim_80, sets).find("'model.n_head': bf16 FlashAttention needs a head dim (n_embd / n_head) of 64 or 128, got 160 / 2 = 80"),
              std::string::npos);
  EXPECT_EQ(error_of("model:\n  n_embd: 256\n  n_head: 2\n", {"train.precision=bf16"}), "");  // 128
}

TEST(Config, RejectsInvalidYaml) {
  EXPECT_NE(error_of("model: [unclosed\n").find("is not valid YAML"), std::string::npos);
  EXPECT_THROW(load_config("/nonexistent/flashgpt.yaml", {}), InputError);
}

TEST(Config, ProgramExitsWithCode2OnBadConfig) {
  for (const char* yaml : {"train:\n  lrr: 1\n", "model:\n  n_embd: 36\n  n_head: 2\n",
                           "model:\n  n_embd: 160\n  n_head: 2\ntrain:\n  precision: bf16\n"}) {
    std::string cmd = std::string(test::flashgpt_binary()) + " train --config " + write_yaml(yaml) + " 2>/dev/null";
    int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << yaml;
    EXPECT_EQ(WEXITSTATUS(status), 2) << yaml;
  }
}

TEST(Schedule, WarmupCosineAndLinear) {
  LRSchedule s{1.0, 10, 110, 0.1, "cosine"};
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(109), 0.1, 1e-12);
  EXPECT_NEAR(s.at(59), 0.1 + 0.45 * (1 + std::cos(M_PI * 49.0 / 99.0)), 1e-12);
  s.kind = "linear";
  EXPECT_NEAR(s.at(109), 0.1, 1e-12);
  EXPECT_NEAR(s.at(10 + 33), 1.0 - 0.9 * 33.0 / 99.0, 1e-12);
  s.kind = "constant";
  EXPECT_DOUBLE_EQ(s.at(100), 1.0);
}

// No warmup: the first step already has the peak lr; past the last step the lr stays at
// its final value (min_lr for cosine and linear), it does not turn back up or go below.
TEST(Schedule, NoWarmupAndStepsPastTheEnd) {
  for (const char* kind : {"cosine", "linear"}) {
    SCOPED_TRACE(kind);
    LRSchedule s{2.0, 0, 50, 0.1, kind};
    EXPECT_DOUBLE_EQ(s.at(0), 2.0);
    EXPECT_LT(s.at(1), 2.0);
    EXPECT_NEAR(s.at(49), 0.2, 1e-12);
    for (int step : {50, 51, 100, 10000}) EXPECT_NEAR(s.at(step), 0.2, 1e-12) << "step " << step;
    double prev = s.at(0);
    for (int step = 1; step < 60; ++step) {
      EXPECT_LE(s.at(step), prev) << "step " << step;
      prev = s.at(step);
    }
  }
  LRSchedule c{2.0, 0, 50, 0.1, "constant"};
  EXPECT_DOUBLE_EQ(c.at(0), 2.0);
  EXPECT_DOUBLE_EQ(c.at(500), 2.0);
  // Warmup longer than the run: the lr is still rising at the last step.
  LRSchedule w{1.0, 100, 10, 0.1, "cosine"};
  EXPECT_DOUBLE_EQ(w.at(9), 0.1);
}

}  // namespace
}  // namespace flashgpt

namespace flashgpt {
namespace {

// parse_positive_int (src/errors.h): the knobs that take a count (FLASHGPT_ATTENTION_BWD_BLOCKS,
// FLASHGPT_ATTENTION_BWD_HEAD_GROUP).
TEST(ParsePositiveInt, TakesDecimalCountsUpToTheLimit) {
  EXPECT_EQ(parse_positive_int("1", "N"), 1);
  EXPECT_EQ(parse_positive_int("132", "N"), 132);
  EXPECT_EQ(parse_positive_int("2147483647", "N"), 2147483647);
  EXPECT_EQ(parse_positive_int("3000000000", "N", "a count", INT64_MAX), 3000000000LL);
  EXPECT_EQ(parse_positive_int("7", "N", "a count", 7), 7);
}

TEST(ParsePositiveInt, AnythingElseIsAnInputErrorNamingTheKnob) {
  for (const char* bad : {"", "0", "-3", "+3", " 3", "3 ", "3x", "0x10", "1e3", "2147483648", "99999999999999999999"}) {
    try {
      parse_positive_int(bad, "FLASHGPT_X", "auto or a positive integer");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("FLASHGPT_X must be auto or a positive integer, got '") + bad + "'");
    }
  }
  EXPECT_THROW(parse_positive_int("8", "N", "a count", 7), InputError);
}

}  // namespace
}  // namespace flashgpt

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

TEST(Config, LoadsEveryShippedConfig) {
  for (const char* name : {"tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-124m-1m"}) {
    Config c = load_config(std::string(FLASHGPT_SOURCE_DIR) + "/configs/" + name + ".yaml", {});
    EXPECT_EQ(c.model.n_embd % c.model.n_head, 0) << name;
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
  EXPECT_NE(error_of("model:\n  n_embd: 30\n  n_head: 2\n  position: rope\n").find("'model.position': rope needs an even head dim"),
            std::string::npos);
  EXPECT_NE(error_of("train:\n  recompute: everything\n").find("'train.recompute': recompute policy 'everything': unknown part"),
            std::string::npos);
  EXPECT_NE(error_of("", {"train.recompute=block+gelu"}).find("'train.recompute'"), std::string::npos);
}

TEST(Config, RejectsInvalidYaml) {
  EXPECT_NE(error_of("model: [unclosed\n").find("is not valid YAML"), std::string::npos);
  EXPECT_THROW(load_config("/nonexistent/flashgpt.yaml", {}), InputError);
}

TEST(Config, ProgramExitsWithCode2OnBadConfig) {
  std::string cmd = std::string(FLASHGPT_BINARY) + " train --config " + write_yaml("train:\n  lrr: 1\n") + " 2>/dev/null";
  int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2);
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

}  // namespace
}  // namespace flashgpt

// train() end to end: the real `flashgpt train` on the fixture's tiny model
// (tests/train_fixture.h) — gradient accumulation against one big batch, the learning
// rate the optimizer was given against the schedule's formula written out here, the
// steps at which it validates and checkpoints, and --resume with the loader's state
// (bit-exact), on the CPU; the same resume in bf16 with fp32 master weights and
// stochastic rounding on a GPU (TrainLoopCuda, skipped without one).
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/train_fixture.h"

namespace flashgpt::test {
namespace {

namespace fs = std::filesystem;

class TrainLoop : public TrainFixture {
 protected:
  // The step numbers of the metrics lines that have `key`.
  static std::vector<int> steps_with(const Run& r, const char* key) {
    std::vector<int> steps;
    for (const auto& j : r.metrics)
      if (j.contains(key)) steps.push_back(j["step"].get<int>());
    return steps;
  }
};

TEST_F(TrainLoop, AccumulationEqualsOneBigBatchFp64) {
  // 192 tokens per step = 12 rows of 16: at once, and as 2, 3 and 4 micro-batches. In
  // fp64 only the order of the sums differs (~1e-16); an accumulation that forgets to
  // divide, drops a micro-batch or re-reads one is off by far more than 1e-10.
  const std::string fp64 = "--set train.precision=fp64 --set train.steps=8 --set train.lr=1e-2";
  Run one = expect_ok(train("one", 0, 12, fp64 + " --set train.eval_steps=2"));
  ASSERT_EQ(one.losses.size(), 8u);
  EXPECT_NE(one.out.find("grad accumulation: 1,"), std::string::npos) << one.out;
  EXPECT_LT(one.losses.back(), one.losses.front() - 0.05) << "the model must move, or the check proves little";
  for (int rows : {6, 4, 3}) {
    // Validation counts batches of batch_size rows: the same 24 rows in 24/rows batches.
    Run r = expect_ok(train("rows" + std::to_string(rows), 0, rows,
                            fp64 + " --set train.eval_steps=" + std::to_string(24 / rows)));
    EXPECT_NE(r.out.find("grad accumulation: " + std::to_string(12 / rows) + ","), std::string::npos) << r.out;
    ASSERT_EQ(r.losses.size(), one.losses.size());
    for (size_t s = 0; s < one.losses.size(); ++s)
      EXPECT_NEAR(r.losses[s], one.losses[s], 1e-10 * one.losses[s]) << rows << " rows, step " << s + 1;
    ASSERT_EQ(r.val_losses.size(), one.val_losses.size());
    EXPECT_NEAR(r.val_losses.back(), one.val_losses.back(), 1e-10 * one.val_losses.back()) << rows << " rows";
  }
}

TEST_F(TrainLoop, TheOptimizerGetsTheScheduledLearningRate) {
  const int steps = 9;
  const double lr = 2e-3, min_frac = 0.25;
  for (const char* kind : {"cosine", "linear", "constant"})
    for (int warmup : {0, 3}) {
      const std::string what = std::string(kind) + ", warmup " + std::to_string(warmup);
      Run r = expect_ok(train(std::string(kind) + std::to_string(warmup), 0, 12,
                              "--set train.steps=" + std::to_string(steps) + " --set train.schedule=" + kind +
                                  " --set train.warmup_steps=" + std::to_string(warmup) +
                                  " --set train.lr=" + std::to_string(lr) +
                                  " --set train.min_lr_frac=" + std::to_string(min_frac)));
      std::vector<double> got;
      for (const auto& j : r.metrics)
        if (j.contains("lr")) got.push_back(j["lr"].get<double>());
      ASSERT_EQ(got.size(), size_t(steps)) << what;
      for (int s = 1; s <= steps; ++s) {  // the s-th update
        double want;
        if (s <= warmup) {
          want = lr * s / warmup;  // linear from lr/warmup up to lr
        } else if (std::string(kind) == "constant") {
          want = lr;
        } else {  // from lr at the first step after warm-up to lr·min_frac at the last
          const double p = double(s - warmup - 1) / double(steps - warmup - 1);
          want = std::string(kind) == "linear" ? lr + (lr * min_frac - lr) * p
                                               : lr * min_frac + 0.5 * (lr - lr * min_frac) * (1 + std::cos(M_PI * p));
        }
        EXPECT_NEAR(got[size_t(s - 1)], want, 1e-12 * lr) << what << ", step " << s;
      }
    }
}

TEST_F(TrainLoop, ValidatesAndCheckpointsOnScheduleAndAtTheEnd) {
  Run r = expect_ok(train("sched", 0, 12,
                          "--set train.steps=7 --set train.eval_every=3 --set train.checkpoint_every=2 "
                          "--set train.keep_checkpoints=0"));
  EXPECT_EQ(steps_with(r, "val_loss"), (std::vector<int>{3, 6, 7}));
  EXPECT_EQ(steps_with(r, "loss"), (std::vector<int>{1, 2, 3, 4, 5, 6, 7}));
  std::vector<std::string> ckpts;
  for (const auto& e : fs::directory_iterator(r.dir))
    if (e.is_directory()) ckpts.push_back(e.path().filename().string());
  std::sort(ckpts.begin(), ckpts.end());
  EXPECT_EQ(ckpts, (std::vector<std::string>{"ckpt_000002", "ckpt_000004", "ckpt_000006", "ckpt_000007"}));
  // eval_every 0 and checkpoint_every 0: only at the end.
  Run end = expect_ok(train("end", 0, 12, "--set train.steps=4 --set train.eval_every=0 --set train.checkpoint_every=0"));
  EXPECT_EQ(steps_with(end, "val_loss"), (std::vector<int>{4}));
  EXPECT_TRUE(fs::is_directory(end.dir + "/ckpt_000004"));
  EXPECT_FALSE(fs::exists(end.dir + "/ckpt_000002"));
}

TEST_F(TrainLoop, ResumeWithAccumulationIsBitExact) {
  // Shuffled data, two micro-batches per step: the loader's position and epoch order,
  // the optimizer's moments and step count all come back from the checkpoint.
  Run full = expect_ok(train("full", 0, 6));
  ASSERT_EQ(full.losses.size(), 20u);
  Run resumed = expect_ok(train("resumed", 0, 6, "--resume " + full.dir + "/ckpt_000010"));
  ASSERT_EQ(resumed.losses.size(), 10u) << resumed.err;
  for (size_t s = 0; s < 10; ++s) EXPECT_EQ(resumed.losses[s], full.losses[10 + s]) << "step " << s + 11;
  ASSERT_FALSE(resumed.val_losses.empty());
  EXPECT_EQ(resumed.val_losses.back(), full.val_losses.back());
}

// train.steps=0 takes no step and saves the initial model (a baseline to evaluate, or a
// run's shared starting point): validated at step 0, and resuming from it is a fresh run.
TEST_F(TrainLoop, StepsZeroSavesTheInitialModel) {
  Run zero = expect_ok(train("zero", 0, 6, "--set train.steps=0"));
  EXPECT_TRUE(zero.losses.empty());
  EXPECT_EQ(steps_with(zero, "val_loss"), (std::vector<int>{0}));
  ASSERT_TRUE(fs::is_directory(zero.dir + "/ckpt_000000")) << zero.out;
  EXPECT_NE(zero.out.find("the initial model is checkpoint"), std::string::npos) << zero.out;
  Run fresh = expect_ok(train("fresh", 0, 6));
  Run resumed = expect_ok(train("from0", 0, 6, "--resume " + zero.dir + "/ckpt_000000"));
  ASSERT_EQ(resumed.losses.size(), fresh.losses.size()) << resumed.err;
  EXPECT_EQ(resumed.losses, fresh.losses);
}

// --init-from takes every weight from the checkpoint (a new run draws none of its own):
// with the learning rate 0 a step leaves them as they were, so the fine-tuned run's
// checkpoint holds the source's model.bin byte for byte; its optimizer starts afresh
// (step 1), and its first loss is the trained model's, not a fresh one's.
TEST_F(TrainLoop, InitFromStartsFromTheCheckpointsWeights) {
  Run source = expect_ok(train("source", 0, 6, "--set train.steps=10"));
  Run tuned = expect_ok(train("tuned", 0, 6,
                              "--set train.steps=1 --set train.lr=0 --set train.eval_steps=0 --init-from " +
                                  source.dir + "/ckpt_000010"));
  ASSERT_EQ(tuned.losses.size(), 1u) << tuned.err;
  EXPECT_EQ(tuned.metrics.front()["step"].get<int>(), 1);
  EXPECT_LT(tuned.losses[0], source.losses[0] - 0.1) << "the first loss must be the trained model's";
  const std::string want = slurp(source.dir + "/ckpt_000010/model.bin");
  ASSERT_GT(want.size(), 1000u);
  EXPECT_TRUE(slurp(tuned.dir + "/ckpt_000001/model.bin") == want) << "weights differ from the checkpoint's";
}

class TrainLoopCuda : public TrainLoop {};

TEST_F(TrainLoopCuda, Bf16ResumeIsBitExact) {
  if (visible_gpus() < 1) GTEST_SKIP() << "no CUDA GPU visible";
  // bf16 weights from fp32 master copies by stochastic rounding (seeded per step), head
  // dim 64 for the bf16 FlashAttention kernels, deterministic dQ so that two runs can be
  // compared bit for bit.
  const std::string bf16 = "--set run.device=cuda --set train.precision=bf16 --set model.n_embd=64 --set model.n_head=1";
  const std::string env = "FLASHGPT_DETERMINISTIC=1";
  Run full = expect_ok(train("full16", 0, 6, bf16, env));
  ASSERT_EQ(full.losses.size(), 20u);
  EXPECT_NE(full.out.find("cuda (bf16)"), std::string::npos) << full.out;
  Run again = expect_ok(train("again16", 0, 6, bf16, env));
  ASSERT_EQ(again.losses, full.losses) << "two bf16 runs differ: the comparison below would prove nothing";
  Run resumed = expect_ok(train("resumed16", 0, 6, bf16 + " --resume " + full.dir + "/ckpt_000010", env));
  ASSERT_EQ(resumed.losses.size(), 10u) << resumed.err;
  for (size_t s = 0; s < 10; ++s) EXPECT_EQ(resumed.losses[s], full.losses[10 + s]) << "step " << s + 11;
}

}  // namespace
}  // namespace flashgpt::test

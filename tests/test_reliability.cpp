// What a run survives: kill -9 at random moments (inside checkpoint writes too) never
// leaves a checkpoint that loads half-written; SIGINT/SIGTERM stop cleanly with a
// checkpoint; NaN/Inf is caught at its step (abort or skip); old checkpoints are pruned;
// interrupted saves are never loaded. All on the real `flashgpt train` (CPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <random>
#include <spawn.h>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include "src/errors.h"
#include "tests/train_fixture.h"
#include "src/config.h"
#include "train/checkpoint.h"
#include "train/memory_plan.h"
#include "train/load_model.h"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using flashgpt::test::slurp;

class Reliability : public flashgpt::test::TrainFixture {
 protected:
  // Starts `flashgpt <args>` (stdout/stderr to files under the scratch dir); returns its pid.
  pid_t spawn(const std::string& args, const std::string& log, const std::string& env = "") {
    const std::string cmd = "OMP_NUM_THREADS=1 " + env + " exec " + flashgpt::test::flashgpt_binary() + " " + args +
                            " >" + dir_.file(log + ".out") + " 2>" + dir_.file(log + ".err");
    const char* argv[] = {"/bin/sh", "-c", cmd.c_str(), nullptr};
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ), 0);
    return pid;
  }
  static int wait_status(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
  }
  static std::string latest(const std::string& run) {
    std::string s = slurp(run + "/latest");
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  static int step_of(const std::string& ckpt_name) { return std::atoi(ckpt_name.c_str() + 5); }  // ckpt_NNNNNN
};

// 20 × SIGKILL at a random moment of a run that checkpoints every step. After each kill:
// every complete checkpoint directory loads (checksums, sizes, shapes), `eval` of the run
// directory works, and `--resume` continues from exactly the step `latest` names.
TEST_F(Reliability, KillNineNeverLeavesABrokenCheckpoint) {
  const std::string run = dir_.file("torture");
  const std::string train = "train -c " + config() + " --set run.out_dir=" + run +
                            " --set train.batch_size=12 --set train.checkpoint_every=1 --set train.eval_every=0"
                            " --set train.steps=1000000";
  auto rng = flashgpt::test::test_rng();
  std::uniform_int_distribution<int> delay_us(0, 120000);
  int kills_after_first = 0;
  for (int k = 0; k < 20; ++k) {
    const bool resume = fs::exists(run + "/latest");
    pid_t pid = spawn(train + (resume ? " --resume " + run : ""), "torture");
    // Kill only once a checkpoint exists (before it there is nothing to protect), at a
    // random moment after that: often in the middle of the next save.
    for (int i = 0; i < 2000 && !fs::exists(run + "/latest"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    kill(pid, SIGKILL);
    const int st = wait_status(pid);
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "kill " << k << ": the run ended by itself: "
                                                            << slurp(dir_.file("torture.err"));
    ASSERT_TRUE(fs::exists(run + "/latest")) << "kill " << k;
    kills_after_first += resume;
    // Every complete checkpoint loads; temporary ones are never named by latest.
    const std::string named = latest(run);
    EXPECT_EQ(named.find(".tmp"), std::string::npos);
    for (const auto& e : fs::directory_iterator(run)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("ckpt_", 0) != 0 || n.find(".tmp") != std::string::npos) continue;
      EXPECT_NO_THROW(flashgpt::verify_checkpoint(e.path().string())) << n << " after kill " << k;
      EXPECT_NO_THROW(flashgpt::load_for_inference(e.path().string(), "cpu", "", 1, 1)) << n << " after kill " << k;
    }
    pid = spawn("eval " + run + " --steps 1 --device cpu", "eval");
    const int es = wait_status(pid);
    ASSERT_TRUE(WIFEXITED(es) && WEXITSTATUS(es) == 0) << "eval after kill " << k << ": " << slurp(dir_.file("eval.err"));
    // --resume runs exactly one more step from the checkpoint latest names.
    const int at = step_of(named);
    pid = spawn("train -c " + config() + " --set run.out_dir=" + run + " --set train.batch_size=12" +
                    " --set train.eval_every=0 --set train.checkpoint_every=1 --set train.steps=" + std::to_string(at + 1) +
                    " --resume " + run, "resume");
    const int rs = wait_status(pid);
    ASSERT_TRUE(WIFEXITED(rs) && WEXITSTATUS(rs) == 0) << "resume after kill " << k << ": " << slurp(dir_.file("resume.err"));
    EXPECT_NE(slurp(dir_.file("resume.out")).find("at step " + std::to_string(at) + "\n"), std::string::npos)
        << slurp(dir_.file("resume.out"));
  }
  EXPECT_GE(kills_after_first, 19);
}

TEST_F(Reliability, InterruptedSavesAreRemovedAndNeverLoaded) {
  const std::string run = dir_.file("stale");
  fs::create_directories(run + "/ckpt_000009.tmp");
  std::ofstream(run + "/ckpt_000009.tmp/model.bin") << "half";
  std::ofstream(run + "/latest.tmp") << "ckpt_000009.tmp\n";
  Run bad = train("stale", 0, 12, "--resume " + run + "/ckpt_000009.tmp/");
  EXPECT_EQ(WEXITSTATUS(bad.status), 2);
  EXPECT_NE(bad.err.find("incomplete checkpoint"), std::string::npos) << bad.err;
  Run ok = expect_ok(train("stale", 0, 12, "--set train.steps=2 --set train.checkpoint_every=1"));
  EXPECT_FALSE(fs::exists(run + "/ckpt_000009.tmp"));
  EXPECT_FALSE(fs::exists(run + "/latest.tmp"));
  EXPECT_EQ(latest(run), "ckpt_000002");
}

// A new run (no --resume) never writes into a directory that holds another run's
// checkpoints (the two runs' checkpoints and metrics would mix). Refused with exit 2 and
// nothing touched; --overwrite starts over
// (the old checkpoints, latest, metrics and config gone first), but never removes the
// checkpoint --init-from names; --overwrite and --resume exclude each other.
TEST_F(Reliability, ANewRunNeverTakesOverAnotherRunsDirectory) {
  Run first = expect_ok(train("reuse", 0, 12, "--set train.steps=2"));
  const std::string model = slurp(first.dir + "/ckpt_000002/model.bin");
  Run again = train("reuse", 0, 12, "--set train.steps=2 --set train.lr=0.01");
  EXPECT_EQ(WEXITSTATUS(again.status), 2) << again.err;
  EXPECT_NE(again.err.find("holds another run's checkpoints"), std::string::npos) << again.err;
  EXPECT_NE(again.err.find("--overwrite"), std::string::npos) << again.err;
  EXPECT_EQ(slurp(first.dir + "/ckpt_000002/model.bin"), model) << "the old run is untouched";
  EXPECT_EQ(again.metrics.size(), first.metrics.size()) << "nothing appended to its metrics";

  Run fresh = expect_ok(train("reuse", 0, 12, "--set train.steps=2 --set train.lr=0.01 --overwrite"));
  EXPECT_NE(slurp(fresh.dir + "/ckpt_000002/model.bin"), model) << "the new run's weights, not the old";
  EXPECT_NE(slurp(fresh.dir + "/ckpt_000002/config.yaml").find("lr: 0.01"), std::string::npos);
  EXPECT_EQ(fresh.losses.size(), 2u) << "metrics.jsonl holds the new run's steps only";
  EXPECT_EQ(latest(fresh.dir), "ckpt_000002");

  Run own = train("reuse", 0, 12, "--overwrite --init-from " + fresh.dir);
  EXPECT_EQ(WEXITSTATUS(own.status), 2) << own.err;
  EXPECT_NE(own.err.find("--overwrite would remove the checkpoint"), std::string::npos) << own.err;
  EXPECT_TRUE(fs::exists(fresh.dir + "/ckpt_000002/model.bin"));
  EXPECT_EQ(WEXITSTATUS(train("reuse", 0, 12, "--overwrite --resume " + fresh.dir).status), 2);
}

// An output directory that cannot be created (here: under a file) is bad input: one
// message naming run.out_dir, exit code 2 (it was "fatal: filesystem error", exit 1).
TEST_F(Reliability, AnOutputDirectoryThatCannotBeCreatedIsBadInput) {
  std::ofstream(dir_.file("a_file")) << "x";
  Run r = train("unused", 0, 12, "--set train.steps=1 --set run.out_dir=" + dir_.file("a_file") + "/run");
  EXPECT_EQ(WEXITSTATUS(r.status), 2) << r.err;
  EXPECT_NE(r.err.find("error: run.out_dir '" + dir_.file("a_file") + "/run': cannot create the directory"),
            std::string::npos) << r.err;
}

// Going back: a run resumed from an earlier checkpoint with other settings replaces the
// later checkpoints of the steps it saves again (they used to keep the first run's, while
// it reported its own); resumed with the same settings it writes the same bytes.
TEST_F(Reliability, ResumingFromAnEarlierStepReplacesTheLaterCheckpoints) {
  // Both ways of replacing a directory: the atomic swap, and the two renames of a file
  // system without RENAME_EXCHANGE.
  for (const std::string env : {"", "FLASHGPT_TEST_NO_RENAME_EXCHANGE=1"}) {
    SCOPED_TRACE(env.empty() ? "renameat2 RENAME_EXCHANGE" : env);
    const std::string name = env.empty() ? "back" : "back_renames";
    Run first = expect_ok(train(name, 0, 12, "--set train.steps=4 --set train.checkpoint_every=1", env));
    const std::string model = slurp(first.dir + "/ckpt_000004/model.bin");
    expect_ok(train(name, 0, 12, "--set train.steps=4 --set train.checkpoint_every=1 --resume " + first.dir +
                                     "/ckpt_000002", env));
    EXPECT_EQ(slurp(first.dir + "/ckpt_000004/model.bin"), model) << "the same settings: bit-exact";
    expect_ok(train(name, 0, 12, "--set train.steps=4 --set train.checkpoint_every=1 --set train.lr=0.02 --resume " +
                                     first.dir + "/ckpt_000002", env));
    EXPECT_NE(slurp(first.dir + "/ckpt_000004/model.bin"), model) << "the resumed run's weights";
    for (const char* step : {"ckpt_000003", "ckpt_000004"})
      EXPECT_NE(slurp(first.dir + "/" + step + "/config.yaml").find("lr: 0.02"), std::string::npos) << step;
    EXPECT_EQ(slurp(first.dir + "/ckpt_000002/config.yaml").find("lr: 0.02"), std::string::npos) << "not rewritten";
    EXPECT_EQ(latest(first.dir), "ckpt_000004");
    for (const auto& e : fs::directory_iterator(first.dir))
      EXPECT_EQ(e.path().string().find(".tmp"), std::string::npos) << e.path() << " left behind";
    for (const char* step : {"ckpt_000003", "ckpt_000004"}) {
      EXPECT_NO_THROW(flashgpt::verify_checkpoint(first.dir + "/" + step)) << step;
      EXPECT_NO_THROW(flashgpt::load_for_inference(first.dir + "/" + step, "cpu", "", 1, 1)) << step;
    }
  }
}

// The CPU pre-flight's plan bounds what a run really holds, a checkpoint save and a
// resume included (a save used to hold the weights and every optimizer tensor at once:
// three arenas more than the plan). The peak resident memory of a run whose arenas
// dominate (about 30M parameters, 118 MB an fp32 arena) must stay within its plan plus
// the program's own footprint, measured as the peak of the same run on the fixture's tiny
// model. While a resume reads the checkpoint, the activation arena (about 5 MB here) and
// the matmul's transposed-weight scratch (the size of the largest matmul weight, 4 MB)
// are not touched yet, a slack in the bound; the largest tensor, wpe (8,192 positions ×
// 512: 16 MB), is larger than the two together, so a plan that left out the resume's
// buffer for one tensor must fail here. glibc's malloc is told to give every freed buffer
// of 1 MiB or more back to the system (by default its threshold rises as large buffers
// are freed, and it keeps freed buffers of up to 32 MiB: allocator policy, which the
// pre-flight's margin covers).
TEST_F(Reliability, SaveAndResumeStayWithinTheCpuMemoryPlan) {
#ifdef __SANITIZE_ADDRESS__
  GTEST_SKIP() << "AddressSanitizer's shadow memory and quarantine are not the program's own";
#endif
  const std::string common = " --set train.batch_size=1 --set train.total_batch=0 --set train.eval_every=0"
                             " --set train.eval_steps=1 --set train.checkpoint_every=1";
  const std::vector<std::string> big = {"model.n_layer=8", "model.n_embd=512", "model.n_head=8",
                                        "model.max_seq_len=8192"};
  std::string big_args;
  for (const auto& b : big) big_args += " --set " + b;
  // Peak resident KB of `flashgpt train` with these arguments.
  auto peak_kb = [&](const std::string& name, const std::string& args) {
    const pid_t pid = spawn("train -c " + config() + " --set run.out_dir=" + dir_.file(name) + common + args, name,
                            "MALLOC_MMAP_THRESHOLD_=1048576");
    int status = 0;
    struct rusage ru {};
    EXPECT_EQ(wait4(pid, &status, 0, &ru), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << name << ": " << slurp(dir_.file(name + ".err"));
    return size_t(ru.ru_maxrss);
  };
  const size_t tiny = peak_kb("tiny", " --set train.steps=1");
  const size_t tiny_resumed = peak_kb("tiny", " --set train.steps=2 --resume " + dir_.file("tiny"));
  // A child's ru_maxrss is at least this test process's own peak resident size: the child
  // shares this process's memory until its exec (posix_spawn), and Linux carries the peak
  // across an exec. Where that peak is not below the tiny run's (the whole test binary run
  // in one process, not a test a process as under ctest), the children's peaks are this
  // process's, and the bounds below would test nothing.
  const std::string status = slurp("/proc/self/status");
  const size_t at = status.find("VmHWM:");
  ASSERT_NE(at, std::string::npos) << "no VmHWM in /proc/self/status";
  const size_t own_peak_kb = std::stoul(status.substr(at + 6));
  if (std::min(tiny, tiny_resumed) <= own_peak_kb)
    GTEST_SKIP() << "this test process's own peak (" << own_peak_kb << " KB) masks the runs' (" << tiny
                 << " KB): run the test in a process of its own (ctest does)";
  const size_t saved = peak_kb("big", big_args + " --set train.steps=1");
  const size_t resumed = peak_kb("big", big_args + " --set train.steps=2 --resume " + dir_.file("big"));
  std::vector<std::string> overrides = big;
  for (const char* o : {"train.batch_size=1", "train.total_batch=0"}) overrides.push_back(o);
  const flashgpt::MemoryPlan plan =
      flashgpt::plan_memory(flashgpt::load_config(config(), overrides), {flashgpt::Device::cpu, flashgpt::DType::f32, 1, 1});
  const size_t arena_kb = plan.num_params * sizeof(float) / 1024;
  ASSERT_GT(arena_kb, 90u * 1024) << "the test wants arenas of about 100 MB";
  const size_t plan_kb = plan.total / 1024;
  EXPECT_LE(saved, plan_kb + tiny) << "a run that saved a checkpoint (plan " << plan_kb << " KB, the program "
                                   << tiny << " KB)";
  EXPECT_LE(resumed, plan_kb + tiny_resumed) << "a resumed run (plan " << plan_kb << " KB, the program "
                                             << tiny_resumed << " KB)";
  // And the plan is not loose by more than an arena: the run touches what it plans.
  EXPECT_GE(saved + arena_kb, plan_kb + tiny) << "plan " << plan_kb << " KB";
  std::printf("[   RSS    ] peak %zu KB saving, %zu KB resuming; plan %zu KB; the program %zu / %zu KB; this test "
              "process %zu KB\n",
              saved, resumed, plan_kb, tiny, tiny_resumed, own_peak_kb);
}

TEST_F(Reliability, KeepCheckpointsKeepsTheNewest) {
  Run r = expect_ok(train("keep", 0, 12, "--set train.steps=5 --set train.checkpoint_every=1 --set train.keep_checkpoints=2"));
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(r.dir))
    if (e.path().filename().string().rfind("ckpt_", 0) == 0) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"ckpt_000004", "ckpt_000005"}));
}

// SIGTERM / SIGINT: the step finishes, a checkpoint is written, exit 128 + signal, and
// the run resumes from it. Two signals at once: the second ends the process at once.
TEST_F(Reliability, SignalsStopCleanlyWithACheckpoint) {
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string run = dir_.file("sig" + std::to_string(sig));
    pid_t pid = spawn("train -c " + config() + " --set run.out_dir=" + run +
                          " --set train.batch_size=12 --set train.steps=1000000 --set train.eval_every=0",
                      "sig");
    for (int i = 0; i < 2000 && slurp(run + "/metrics.jsonl").find("\"step\":3") == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    kill(pid, sig);
    const int st = wait_status(pid);
    ASSERT_TRUE(WIFEXITED(st)) << "killed by the signal instead of stopping";
    EXPECT_EQ(WEXITSTATUS(st), 128 + sig);
    const std::string out = slurp(dir_.file("sig.out"));
    const std::string named = latest(run);
    EXPECT_NE(out.find("stopped by " + std::string(sig == SIGTERM ? "SIGTERM" : "SIGINT") + " after step " +
                       std::to_string(step_of(named))),
              std::string::npos) << out;
    EXPECT_GE(step_of(named), 3);
  }
  pid_t pid = spawn("train -c " + config() + " --set run.out_dir=" + dir_.file("twice") +
                        " --set train.batch_size=12 --set train.steps=1000000",
                    "twice");
  for (int i = 0; i < 2000 && slurp(dir_.file("twice/metrics.jsonl")).find("\"step\":1") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // Two different signals (two of the same kind may merge into one delivery).
  kill(pid, SIGTERM);
  kill(pid, SIGINT);
  const int st = wait_status(pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_TRUE(WEXITSTATUS(st) == 128 + SIGTERM || WEXITSTATUS(st) == 128 + SIGINT) << WEXITSTATUS(st);
  EXPECT_NE(slurp(dir_.file("twice.err")).find("second signal"), std::string::npos);
}

// train.nonfinite=abort (default): a NaN gradient at step 3 stops the run there, and no
// checkpoint holds step 3's state.
TEST_F(Reliability, NonFiniteAbortsAtItsStepWithoutACheckpoint) {
  Run r = train("nan_abort", 0, 12, "--set train.steps=6 --set train.checkpoint_every=1", "FLASHGPT_TEST_NAN_AT=3");
  EXPECT_EQ(WEXITSTATUS(r.status), 1);
  EXPECT_NE(r.err.find("non-finite gradient norm at step 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the last checkpoint is step 2"), std::string::npos) << r.err;
  EXPECT_EQ(latest(r.dir), "ckpt_000002");
  EXPECT_FALSE(fs::exists(r.dir + "/ckpt_000003"));
  EXPECT_EQ(r.losses.size(), 2u);
}

// train.nonfinite=skip: the bad step changes nothing (the checkpoint after it holds the
// very bytes of the one before), it is counted, and training goes on; too many in a row
// abort.
TEST_F(Reliability, NonFiniteSkipLeavesWeightsAndOptimizerUntouched) {
  Run r = expect_ok(train("nan_skip", 0, 12, "--set train.steps=5 --set train.checkpoint_every=1 --set train.nonfinite=skip",
                          "FLASHGPT_TEST_NAN_AT=5"));
  for (const char* f : {"model.bin", "optimizer.bin"})
    EXPECT_EQ(slurp(r.dir + "/ckpt_000005/" + f), slurp(r.dir + "/ckpt_000004/" + f)) << f;
  bool seen = false;
  for (const auto& m : r.metrics)
    if (m.value("skipped", false)) seen = m["step"] == 5 && m["skips"] == 1;
  EXPECT_TRUE(seen) << "metrics.jsonl records the skip";

  Run mid = expect_ok(train("nan_mid", 0, 12, "--set train.steps=6 --set train.nonfinite=skip", "FLASHGPT_TEST_NAN_AT=3"));
  EXPECT_EQ(mid.losses.size(), 5u) << "5 updates, step 3 skipped";
  int last_skips = -1;
  for (const auto& m : mid.metrics)
    if (m.contains("loss")) last_skips = m.value("skips", 0);
  EXPECT_EQ(last_skips, 1) << "later progress lines count the skip";

  Run many = train("nan_many", 0, 12, "--set train.steps=8 --set train.nonfinite=skip --set train.nonfinite_limit=3",
                   "FLASHGPT_TEST_NAN_AT=2,3,4");
  EXPECT_EQ(WEXITSTATUS(many.status), 1);
  EXPECT_NE(many.err.find("3 non-finite steps in a row"), std::string::npos) << many.err;
}

}  // namespace

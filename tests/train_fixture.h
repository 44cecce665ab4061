// The real `flashgpt train` as a subprocess on a tiny model and a small synthetic
// language (a noisy affine Markov chain over 256 tokens, so the loss really falls),
// written once per test into a scratch directory. Shared by the distributed and the
// reliability tests.
#pragma once
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/shard.h"
#include "tests/testing.h"
#ifdef FLASHGPT_WITH_CUDA
#include "src/cuda/device_context.h"
#endif

namespace flashgpt::test {

// GPUs the tests can use (0 in a CPU-only build).
inline int visible_gpus() {
#ifdef FLASHGPT_WITH_CUDA
  return cuda_device_count();
#else
  return 0;
#endif
}

inline std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

class TrainFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng = test_rng();
    auto chain = [&](size_t n) {
      std::vector<uint16_t> t(n);
      std::uniform_int_distribution<int> noise(0, 3);
      uint32_t x = 1;
      for (auto& v : t) v = uint16_t(x = (x * 17 + 31 + uint32_t(noise(rng))) % 256);
      return t;
    };
    write_shard(dir_.file("train_000000.bin"), chain(40000));
    write_shard(dir_.file("train_000001.bin"), chain(25001));
    write_shard(dir_.file("val_000000.bin"), chain(4000));
    std::ofstream(dir_.file("tiny.yaml"))
        << "model: {n_layer: 2, n_head: 2, n_embd: 32, vocab_size: 256, padded_vocab: 256, max_seq_len: 32}\n"
        << "train: {seq_len: 16, total_batch: 192, lr: 3.0e-3, warmup_steps: 3, steps: 20, eval_every: 10,\n"
        << "        eval_steps: 2, log_every: 1, checkpoint_every: 10, seed: 7, precision: fp32}\n"
        << "data: {train: '" << dir_.file("train_*.bin") << "', val: '" << dir_.file("val_*.bin") << "'}\n"
        << "run: {device: cpu}\n";
  }

  struct Run {
    int status = -1;  // as from std::system: WEXITSTATUS gives the exit code
    double seconds = 0;
    std::string out, err, dir;
    std::vector<double> losses;      // per step, from metrics.jsonl
    std::vector<double> val_losses;  // per evaluation
    std::vector<nlohmann::json> metrics;
  };

  std::string config() const { return dir_.file("tiny.yaml"); }

  // flashgpt train on `ranks` MPI processes (0: without mpirun) with `batch` rows per rank.
  Run train(const std::string& name, int ranks, int batch, const std::string& extra = "",
            const std::string& env = "") {
    Run r;
    r.dir = dir_.file(name);
    const std::string out = r.dir + ".out", err = r.dir + ".err";
    std::string launch = ranks == 0 ? std::string()
                                    : "mpirun --allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1 -np " +
                                          std::to_string(ranks) + " ";
    const std::string cmd = "OMP_NUM_THREADS=1 " + env + " timeout 120 " + launch + flashgpt_binary() +
                            " train -c " + config() + " --set run.out_dir=" + r.dir +
                            " --set train.batch_size=" + std::to_string(batch) + " " + extra + " >" + out +
                            " 2>" + err;
    const auto t0 = std::chrono::steady_clock::now();
    r.status = std::system(cmd.c_str());
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.out = slurp(out);
    r.err = slurp(err);
    std::ifstream metrics(r.dir + "/metrics.jsonl");
    for (std::string line; std::getline(metrics, line);) {
      auto j = nlohmann::json::parse(line);
      r.metrics.push_back(j);
      if (j.contains("loss") && !j.contains("skipped")) r.losses.push_back(j["loss"].get<double>());
      if (j.contains("val_loss")) r.val_losses.push_back(j["val_loss"].get<double>());
    }
    return r;
  }

  Run expect_ok(Run r) {
    EXPECT_EQ(r.status, 0) << r.err << r.out;
    return r;
  }

  ScratchDir dir_{"fg_train_"};
};

}  // namespace flashgpt::test

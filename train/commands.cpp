// `flashgpt train` and `flashgpt eval`.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "src/commands.h"
#include "src/config.h"
#include "src/errors.h"
#include "train/comm.h"
#include "train/trainer.h"

namespace flashgpt {

void add_train_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("train", "Train a GPT-2 model from a YAML config");
    auto config = std::make_shared<std::string>();
    auto sets = std::make_shared<std::vector<std::string>>();
    auto resume = std::make_shared<std::string>();
    cmd->add_option("-c,--config", *config, "YAML config file (configs/*.yaml); defaults if omitted")->check(CLI::ExistingFile);
    cmd->add_option("--set", *sets, "Override a config key, e.g. --set train.lr=3e-4 (repeatable)");
    cmd->add_option("--resume", *resume, "Resume from a checkpoint directory, or a run directory's latest checkpoint");
    cmd->callback([=] {
      // Under mpirun: one process per GPU (or per CPU rank), world = -np.
      auto comm = make_host_communicator();
      int stop_signal = 0;
      on_every_rank(*comm, [&] {
        Config cfg = load_config(*config, *sets);
        TrainResult r = train(cfg, *resume, *comm);
        stop_signal = r.stop_signal;
        if (comm->rank() != 0 || stop_signal) return;
        std::printf("done: %d steps, train loss %.4f", r.steps_done, r.last_train_loss);
        if (r.last_val_loss >= 0) std::printf(", val loss %.4f", r.last_val_loss);
        if (!r.last_checkpoint.empty()) std::printf(", checkpoint %s", r.last_checkpoint.c_str());
        std::printf("\n");
      });
      comm.reset();  // MPI_Finalize on every rank before the exit status
      if (stop_signal) {
        std::fflush(stdout);
        std::exit(128 + stop_signal);  // 130 SIGINT, 143 SIGTERM, 138 SIGUSR1
      }
    });
  }
  {
    auto* cmd = app.add_subcommand("eval", "Validation loss and perplexity of a checkpoint");
    auto ckpt = std::make_shared<std::string>();
    auto data = std::make_shared<std::string>();
    auto device = std::make_shared<std::string>("auto");
    auto steps = std::make_shared<int>(0);
    auto batch = std::make_shared<int>(0);
    cmd->add_option("checkpoint", *ckpt, "Checkpoint directory, or a run directory (uses its latest)")->required();
    cmd->add_option("--data", *data, "Glob of token shards (default: the run's data.val)");
    cmd->add_option("--steps", *steps, "Batches to evaluate (default: one pass over the data)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--batch-size", *batch, "Sequences per batch (default: the run's train.batch_size)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--device", *device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    cmd->callback([=] {
      EvalResult r = evaluate_checkpoint(*ckpt, *data, *steps, *device, *batch);
      std::printf("eval: loss %.4f | perplexity %.2f | %ld tokens\n", r.loss, r.perplexity, r.tokens);
    });
  }
}

}  // namespace flashgpt

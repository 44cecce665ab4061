// `flashgpt train` and `flashgpt eval`.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>
#include "src/commands.h"
#include "src/config.h"
#include "src/errors.h"
#include "train/checkpoint.h"
#include "train/comm.h"
#include "train/eval_text.h"
#include "train/trainer.h"

namespace flashgpt {
namespace {

// Whether path lies in directory dir (both as they resolve on the disk).
bool inside(const std::string& path, const std::string& dir) {
  std::error_code ec;
  const auto p = std::filesystem::weakly_canonical(path, ec);
  auto d = std::filesystem::weakly_canonical(dir, ec);
  if (d.filename().empty()) d = d.parent_path();  // "runs/x/"
  const auto mismatch = std::mismatch(d.begin(), d.end(), p.begin(), p.end());
  return mismatch.first == d.end();
}

}  // namespace

void add_train_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("train", "Train a GPT-2 model from a YAML config");
    auto config = std::make_shared<std::string>();
    auto sets = std::make_shared<std::vector<std::string>>();
    auto resume = std::make_shared<std::string>();
    auto init_from = std::make_shared<std::string>();
    cmd->add_option("-c,--config", *config, "YAML config file (configs/*.yaml); defaults if omitted")->check(CLI::ExistingFile);
    cmd->add_option("--set", *sets, "Override a config key, e.g. --set train.lr=3e-4 (repeatable)");
    cmd->add_option("--resume", *resume, "Resume from a checkpoint directory, or a run directory's latest checkpoint");
    cmd->add_option("--init-from", *init_from, "Start from a checkpoint's weights with a fresh optimizer (fine-tuning); "
                    "same as --set train.init_from=PATH")->excludes("--resume");
    auto overwrite = std::make_shared<bool>(false);
    cmd->add_flag("--overwrite", *overwrite, "Start afresh in run.out_dir: first remove the checkpoints, latest, "
                  "metrics.jsonl and config.yaml an earlier run left there")->excludes("--resume");
    cmd->callback([=] {
      // Under mpirun: one process per GPU (or per CPU rank), world = -np.
      auto comm = make_host_communicator();
      int stop_signal = 0;
      std::vector<std::string> overrides = *sets;
      if (!init_from->empty()) overrides.push_back("train.init_from=" + *init_from);
      on_every_rank(*comm, [&] {
        Config cfg = load_config(*config, overrides);
        if (*overwrite && comm->rank() == 0) {
          if (!cfg.train.init_from.empty() && inside(resolve_checkpoint(cfg.train.init_from), cfg.run.out_dir))
            fail_input("--overwrite would remove the checkpoint that train.init_from names ('", cfg.train.init_from,
                       "'): choose another run.out_dir");
          clear_run_dir(cfg.run.out_dir);
        }
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
    auto text = std::make_shared<TextEvalOptions>();
    auto json = std::make_shared<bool>(false);
    cmd->add_option("checkpoint", *ckpt, "Checkpoint directory, or a run directory (uses its latest)")->required();
    cmd->add_option("--data", *data, "Glob of token shards (default: the run's data.val)");
    cmd->add_option("--steps", *steps, "Batches to evaluate (default: one pass over the data)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--batch-size", *batch, "Sequences per batch (default: the run's train.batch_size)")->check(CLI::NonNegativeNumber);
    cmd->add_option("--device", *device, "auto | cpu | cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
    auto* text_opt = cmd->add_option("--text", text->text_file, "Raw text file: perplexity with sliding windows (README: Perplexity of raw text)")
                         ->check(CLI::ExistingFile)->excludes("--data")->excludes("--steps");
    cmd->add_option("--seq-len", text->seq_len, "--text: window length T (default: the model's context)")
        ->check(CLI::Range(1, INT_MAX))->needs(text_opt);
    cmd->add_option("--stride", text->stride, "--text: window stride S <= T (default: T/2); each token gets >= T-S+1 tokens of context")
        ->check(CLI::Range(1, INT_MAX))->needs(text_opt);
    cmd->add_option("--vocab", text->vocab, "--text: directory with encoder.json and vocab.bpe (default: cache/gpt2)")
        ->needs(text_opt);
    cmd->add_option("--precision", text->precision, "--text: auto | bf16 | fp32 | fp64 (default: the checkpoint's)")
        ->check(CLI::IsMember({"auto", "bf16", "fp32", "fp64"}))->needs(text_opt);
    cmd->add_flag("--json", *json, "Print the result as one JSON object");
    cmd->callback([=] {
      if (!text->text_file.empty()) {
        text->checkpoint = *ckpt;
        text->device = *device;
        text->batch_size = *batch;
        TextEvalResult r = evaluate_text(*text);
        if (*json)
          std::printf("{\"loss\": %.17g, \"perplexity\": %.17g, \"bits_per_byte\": %.17g, \"tokens\": %ld, "
                      "\"bytes\": %ld, \"windows\": %ld, \"seq_len\": %d, \"stride\": %d}\n",
                      r.loss, r.perplexity, r.bits_per_byte, r.tokens, r.bytes, r.windows, r.seq_len, r.stride);
        else
          std::printf("eval: loss %.4f | perplexity %.2f | %.4f bits/byte | %ld tokens in %ld windows (T %d, stride %d)\n",
                      r.loss, r.perplexity, r.bits_per_byte, r.tokens, r.windows, r.seq_len, r.stride);
        return;
      }
      EvalResult r = evaluate_checkpoint(*ckpt, *data, *steps, *device, *batch);
      if (*json)
        std::printf("{\"loss\": %.17g, \"perplexity\": %.17g, \"tokens\": %ld}\n", r.loss, r.perplexity, r.tokens);
      else
        std::printf("eval: loss %.4f | perplexity %.2f | %ld tokens\n", r.loss, r.perplexity, r.tokens);
    });
  }
}

}  // namespace flashgpt

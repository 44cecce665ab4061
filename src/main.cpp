// flashgpt: one program, one subcommand per job. main() only dispatches.
#include <cstdio>
#include "src/commands.h"
#include "src/errors.h"

int main(int argc, char** argv) {
  CLI::App app{"flashgpt: train GPT-2 from scratch with hand-written passes and FlashAttention"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Show help for every subcommand");
  // A parse error (an unknown option, a bad value) reads like our other input errors: one
  // line of UTF-8 with the argument's control characters and stray bytes escaped.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "error: " + flashgpt::one_line(e.what()) + "\nRun with --help or --help-all for more information.\n";
  });
  flashgpt::add_info_command(app);
  flashgpt::add_train_commands(app);
  flashgpt::add_data_commands(app);
  flashgpt::add_bench_commands(app);
  flashgpt::add_sample_command(app);
  flashgpt::add_interop_commands(app);
  flashgpt::add_memory_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const flashgpt::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fatal: %s\n", flashgpt::one_line(e.what()).c_str());
    return 1;
  }
  return 0;
}

// The `specula` command: generate, serve, bench. Every error reaches the user as one line on
// stderr and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>

#include "specula/cli/bench_attention.h"
#include "specula/cli/bench_generate.h"
#include "specula/cli/bench_serve.h"
#include "specula/cli/generate.h"
#include "specula/core/error.h"

namespace {

// Subcommands whose engine parts arrive with later issues say so plainly instead of pretending.
void add_pending(CLI::App& app, const char* name, const char* description, const char* needs) {
  CLI::App* cmd = app.add_subcommand(name, description);
  cmd->allow_extras();
  cmd->callback([name, needs] {
    throw specula::Error(fmt::format("'specula {}' is not available in this version: it needs {}", name, needs));
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"specula: an LLM inference engine with paged attention and EAGLE speculative decoding", "specula"};
  app.set_version_flag("--version", fmt::format("specula {}", SPECULA_VERSION));
  app.require_subcommand(1);

  specula::add_generate_command(app);
  add_pending(app, "serve", "Serve an OpenAI-compatible HTTP API", "the serving runtime and HTTP server");
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  specula::add_bench_attention_command(*bench);
  specula::add_bench_generate_command(*bench);
  specula::add_bench_serve_command(*bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const specula::Error& e) {
    std::fprintf(stderr, "specula: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specula: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}

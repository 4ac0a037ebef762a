// The `specula` command: generate, serve, bench. Every error reaches the user as one line on
// stderr and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "specula/cli/bench_attention.h"
#include "specula/cli/bench_generate.h"
#include "specula/cli/bench_serve.h"
#include "specula/cli/generate.h"
#include "specula/core/error.h"

namespace {

// OpenBLAS starts its worker threads in its library constructor, before main; when that fails
// (a low `ulimit -v`, a thread limit) it prints two lines and raises SIGINT on itself. This hook
// runs from .preinit_array, before any shared library's constructor, and turns such a SIGINT
// into one clear error and exit status 1. main() restores the default action first thing.
void blas_start_failed(int) {
  static const char message[] =
      "specula: error: the BLAS library (OpenBLAS) could not start its threads: too little memory or too many "
      "threads for this process's limits; raise them (ulimit -v / -u) or set OPENBLAS_NUM_THREADS=1\n";
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, message, sizeof(message) - 1);
  std::_Exit(1);
}
void catch_blas_start_failure(int, char**, char**) { std::signal(SIGINT, blas_start_failed); }
__attribute__((section(".preinit_array"), used)) void (*const preinit_hook)(int, char**, char**) =
    catch_blas_start_failure;

// Leaves without running exit handlers: OpenBLAS's joins its worker threads, and a worker stuck
// retrying an allocation the memory limit refuses would hang the process for ever. Everything
// specula writes is flushed here; the engine and its files are closed before main returns.
[[noreturn]] void leave(int status) {
  std::fflush(nullptr);
  std::_Exit(status);
}

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
  std::signal(SIGINT, SIG_DFL);
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
    leave(app.exit(e));
  } catch (const specula::Error& e) {
    std::fprintf(stderr, "specula: error: %s\n", e.what());
    leave(1);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "specula: error: out of host memory\n");
    leave(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "specula: internal error: %s\n", e.what());
    leave(1);
  }
  leave(0);
}

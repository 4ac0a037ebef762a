// The `specula` command: generate, serve, bench. Every error reaches the user as one line on
// stderr and a non-zero exit status.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "specula/cli/bench_attention.h"
#include "specula/cli/bench_generate.h"
#include "specula/cli/bench_grammar.h"
#include "specula/cli/bench_moe.h"
#include "specula/cli/bench_allreduce.h"
#include "specula/cli/bench_linear.h"
#include "specula/cli/bench_perplexity.h"
#include "specula/cli/bench_spec_cost.h"
#include "specula/cli/bench_serve.h"
#include "specula/cli/generate.h"
#ifdef SPECULA_HAS_SERVER
#include "specula/cli/serve.h"
#endif
#include "specula/core/error.h"
#include "specula/model/cpu_ops.h"

namespace {

// Shared libraries initialise before main, and two of them fail loudly when the address space
// is short (a low `ulimit -v`): OpenBLAS, failing to start its threads, prints two lines and
// raises SIGINT on itself; cuBLAS-Lt's initializer segfaults. This hook runs from
// .preinit_array, before any shared library's constructor, and turns those signals into one
// clear error and exit status 1. main() puts the previous actions back first thing, so signals
// after start-up (a user's Ctrl-C, a sanitizer's SEGV report) behave as they would without it.
void start_up_failed(int sig) {
  static const char blas[] =
      "specula: error: the BLAS library (OpenBLAS) could not start its threads: too little memory or too many "
      "threads for this process's limits; raise them (ulimit -v / -u) or set OPENBLAS_NUM_THREADS=1\n";
  static const char crash[] =
      "specula: error: a shared library crashed while loading, before specula started: too little address space? "
      "(raise ulimit -v)\n";
  const bool interrupt = sig == SIGINT;
  [[maybe_unused]] const ssize_t written =
      ::write(STDERR_FILENO, interrupt ? blas : crash, (interrupt ? sizeof(blas) : sizeof(crash)) - 1);
  std::_Exit(1);
}
struct sigaction g_previous[3];
constexpr int kStartUpSignals[3] = {SIGINT, SIGSEGV, SIGBUS};
void catch_start_up_failures(int, char**, char**) {
  struct sigaction action {};
  action.sa_handler = start_up_failed;
  sigemptyset(&action.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kStartUpSignals[i], &action, &g_previous[i]);
}
void restore_start_up_signals() {
  for (int i = 0; i < 3; ++i) sigaction(kStartUpSignals[i], &g_previous[i], nullptr);
}
__attribute__((section(".preinit_array"), used)) void (*const preinit_hook)(int, char**, char**) =
    catch_start_up_failures;

// Leaves without running exit handlers: OpenBLAS's joins its worker threads, and a worker stuck
// retrying an allocation the memory limit refuses would hang the process for ever. Everything
// specula writes is flushed here; the engine and its files are closed before main returns.
[[noreturn]] void leave(int status) {
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
  // _Exit skips LeakSanitizer's check at exit; the sanitizer preset still gets it.
  __lsan_do_leak_check();
#endif
  std::_Exit(status);
}

// CLI11 reads a value of a multi-value option that starts with '[' and ends with ']' as a list
// ("[a, b]" is two values, "[x]" is x, "[]" none, which then swallows the next argument as the
// value), and such an option also takes every following word up to the next flag. Prompts and
// stop strings must reach the engine byte for byte, so every text option of every command takes
// exactly one value per use, unchanged: repeat the flag for more. Numeric lists keep CLI11's
// syntax (--stop-token-ids 1,2 or 1 2), where a bracket cannot be part of a value anyway; any
// other type name (TEXT, or a FILE a command might name) counts as text.
void take_text_verbatim(CLI::App& app) {
  for (CLI::Option* option : app.get_options()) {
    // By prefix: a validator appends its own text to the type name ("INT:POSITIVE").
    const std::string type = option->get_type_name();
    const bool numeric = type.rfind("INT", 0) == 0 || type.rfind("UINT", 0) == 0 || type.rfind("FLOAT", 0) == 0;
    if (!numeric && option->get_allow_extra_args()) option->allow_extra_args(false);
  }
  for (CLI::App* command : app.get_subcommands(std::function<bool(CLI::App*)>{})) take_text_verbatim(*command);
}

}  // namespace

int main(int argc, char** argv) {
  restore_start_up_signals();
  CLI::App app{"specula: an LLM inference engine with paged attention and EAGLE speculative decoding", "specula"};
  app.set_version_flag("--version", fmt::format("specula {}", SPECULA_VERSION));
  app.require_subcommand(1);

  specula::add_generate_command(app);
#ifdef SPECULA_HAS_SERVER
  specula::add_serve_command(app);
#else
  // Built without cpp-httplib: the command exists and says what it needs.
  CLI::App* serve = app.add_subcommand("serve", "Serve an OpenAI-compatible HTTP API");
  serve->allow_extras();
  serve->callback([] {
    throw specula::Error("'specula serve' is not available in this build: it needs cpp-httplib at build time "
                         "(Debian/Ubuntu: libcpp-httplib-dev; scripts/setup.sh installs it)");
  });
#endif
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  specula::add_bench_attention_command(*bench);
  specula::add_bench_generate_command(*bench);
  specula::add_bench_serve_command(*bench);
  specula::add_bench_spec_cost_command(*bench);
  specula::add_bench_grammar_command(*bench);
  specula::add_bench_moe_command(*bench);
  specula::add_bench_allreduce_command(*bench);
  specula::add_bench_linear_command(*bench);
  specula::add_bench_perplexity_command(*bench);
  take_text_verbatim(app);

  // Once the command line is parsed (not for --help or --version), before any command runs.
  app.parse_complete_callback([] { specula::reserve_cpu_blas_buffers(); });
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

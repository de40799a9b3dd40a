// moepack: ahead-of-time conversion of quantized MoE checkpoints into backend-ready layouts.
// Exit codes (README.md): 0 ok, 1 verification failed, 2 usage, 3 invalid input,
// 4 unsupported, 5 I/O, 70 internal error.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "core/memory.h"
#include "core/version.h"
#include "io/atomic_dir.h"
#include "model/hf_hub.h"
#include "tools/cli.h"

namespace moepack::cli {

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

std::string resolve_checkpoint_arg(const std::string& arg, const Globals& g) {
  const ResolvedCheckpoint r = resolve_checkpoint(arg);
  if (r.from_cache() && !g.json)
    std::cerr << "moepack: " << arg << ": Hugging Face cache snapshot " << r.dir << " (" << r.hub_id
              << ", " << (r.ref == r.revision ? "commit " : r.ref + " = ") << r.revision << ")\n";
  return r.dir;
}

void print_json(const nlohmann::json& j) {
  // replace: an error message may quote invalid UTF-8 from a hostile file (a JSON parse error's
  // "last read" bytes); printing it must not throw.
  std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << std::endl;
}

namespace {

// A signal that would end the process first removes its unfinished outputs (temporary siblings,
// a half-done replace rolled back; io/atomic_dir.h), then ends it by the same signal with the
// default action, so the exit status is 128 + the signal number in a shell and a parent sees
// WIFSIGNALED (a shell loop stops on Ctrl-C). SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGABRT are best
// effort: the handler runs on an alternate stack, so even a stack overflow gets there.
extern "C" void remove_outputs_and_die(int sig) {
  moepack::abandon_pending_outputs();
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);  // pending until the handler returns (the signal is blocked in it), then fatal
}

void remove_outputs_on_fatal_signals() {
  static char alt_stack[1 << 16];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = remove_outputs_and_die;
  sigemptyset(&sa.sa_mask);
  const int signals[] = {SIGINT,  SIGTERM, SIGHUP, SIGQUIT, SIGXFSZ,
                         SIGSEGV, SIGBUS,  SIGFPE, SIGILL,  SIGABRT};
  for (int sig : signals) sigaddset(&sa.sa_mask, sig);  // one handler at a time
  sa.sa_flags = SA_ONSTACK;
  for (int sig : signals) {
    struct sigaction old {};
    // A signal ignored by the parent (nohup, `trap '' INT`) stays ignored.
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

}  // namespace moepack::cli

int main(int argc, char** argv) {
  using namespace moepack;
  keep_freed_memory_for_reuse();
  cli::remove_outputs_on_fatal_signals();
  CLI::App app{
      "moepack: convert quantized MoE checkpoints into backend-ready layouts ahead of time"};
  app.set_version_flag("--version", std::string("moepack ") + moepack_version());
  app.require_subcommand(1);
  cli::Globals g;
  std::vector<std::pair<CLI::App*, cli::Runner>> runners;
  auto add = [&](const char* name, const char* help, cli::Runner (*fn)(CLI::App&, cli::Globals&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    sub->add_flag("--json", g.json, "Print the result as JSON on stdout");
    runners.emplace_back(sub, fn(*sub, g));
  };
  add("inspect",
      "Describe a checkpoint: format, MoE layers, tensors, and the backend the oracle picks",
      cli::add_inspect);
  add("convert", "Write a backend-ready checkpoint (safetensors + index + config + moepack.json)",
      cli::add_convert);
  add("merge",
      "Assemble the parts of `convert --shard I/N` into the output a single convert writes",
      cli::add_merge);
  add("verify",
      "Prove a converted checkpoint right: integrity, exact round-trip, fused MoE vs reference",
      cli::add_verify);
  add("synth", "Write a realistic random MoE checkpoint in any supported source format",
      cli::add_synth);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return static_cast<int>(ExitCode::kUsage);
  }
  try {
    for (auto& [sub, run] : runners)
      if (sub->parsed()) return run();
    return static_cast<int>(ExitCode::kUsage);
  } catch (const Error& e) {
    const int code = static_cast<int>(e.exit_code());
    if (g.json)
      cli::print_json({{"ok", false},
                       {"exit_code", code},
                       {"error",
                        {{"code", error_code_name(e.code())},
                         {"file", e.file()},
                         {"tensor", e.tensor()},
                         {"message", e.message()}}}});
    std::cerr << "moepack: error: " << e.what() << "\n";
    return code;
  } catch (const std::bad_alloc&) {
    std::cerr << "moepack: error: out of memory\n";
    return static_cast<int>(ExitCode::kIo);
  } catch (const std::exception& e) {
    std::cerr << "moepack: internal error: " << e.what() << "\n";
    return static_cast<int>(ExitCode::kInternal);
  }
}

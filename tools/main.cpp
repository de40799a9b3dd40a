// moepack: ahead-of-time conversion of quantized MoE checkpoints into backend-ready layouts.
// Exit codes (README.md): 0 ok, 1 verification failed, 2 usage, 3 invalid input,
// 4 unsupported, 5 I/O, 70 internal error.
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <system_error>

#include "core/error.h"
#include "core/memory.h"
#include "core/version.h"
#include "io/atomic_dir.h"
#include "model/hf_hub.h"
#include "moepack_build_info.h"
#include "tools/cli.h"
#include "tools/flags.h"

namespace moepack::cli {

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

CLI::Validator integer_at_least(long long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return "expected an integer, got \"" + text + "\"";
        if (v < min) return "must be " + std::to_string(min) + " or more, got " + text;
        return "";
      },
      "INT>=" + std::to_string(min));
}

CLI::Validator real_at_least(double min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        size_t used = 0;
        double v = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size() || !std::isfinite(v))
          return "expected a number, got \"" + text + "\"";
        if (v < min) return "must be " + CLI::detail::to_string(min) + " or more, got " + text;
        return "";
      },
      "NUMBER>=" + CLI::detail::to_string(min));
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

namespace moepack::cli {
namespace {

// `moepack --version`: what was built, from what.
std::string version_text() {
  return std::string("moepack ") + moepack_version() + "\ncommit " + MOEPACK_GIT_COMMIT +
         "\nbuild type " + MOEPACK_BUILD_TYPE + "\nCUDA archs " + MOEPACK_CUDA_ARCHS;
}

// --json anywhere on the command line: a failure before or during parsing is reported as JSON too.
bool json_requested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) return true;
  return false;
}

// The JSON error object every failure prints under --json (best effort: printing may itself fail
// when memory is exhausted).
void print_json_error(int code, const char* kind, const std::string& message,
                      const std::string& file = "", const std::string& tensor = "") {
  try {
    print_json(
        {{"ok", false},
         {"exit_code", code},
         {"error", {{"code", kind}, {"file", file}, {"tensor", tensor}, {"message", message}}}});
  } catch (...) {
  }
}

// "Did you mean" for a parse error: an unknown subcommand gets the closest subcommand's name, an
// unknown option the closest option of its subcommand (tools/flags.h closest_to). "" when no
// word of the command line is a near miss.
std::string parse_suggestion(const CLI::App& app, int argc, char** argv) {
  const CLI::App* sub = nullptr;
  std::vector<std::string> subs;
  for (const CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; })) {
    subs.push_back(s->get_name());
    if (s->parsed()) sub = s;
  }
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    if (!sub) {
      if (word.empty() || word[0] == '-') continue;
      const std::string best = closest_to(word, subs);
      return best.empty() ? "" : "did you mean \"" + best + "\"?";
    }
    if (word.size() < 3 || word.compare(0, 2, "--") != 0) continue;  // long options only
    word = word.substr(0, word.find('='));
    if (sub->get_option_no_throw(word) || word == "--help") continue;
    std::vector<std::string> names;
    for (const CLI::Option* o : sub->get_options())
      for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
    const std::string best = closest_to(word, names);
    if (!best.empty()) return "did you mean " + best + " (not " + word + ")?";
  }
  return "";
}

constexpr const char* kOutOfMemory = "out of memory: lower --threads or --chunk-size";

int run(int argc, char** argv, Globals& g) {
  CLI::App app{
      "moepack: convert quantized MoE checkpoints into backend-ready layouts ahead of time"};
  app.set_version_flag("--version", version_text());
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, Runner>> runners;
  auto add = [&](const char* name, const char* help, Runner (*fn)(CLI::App&, Globals&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    sub->add_flag("--json", g.json, "Print the result as JSON on stdout");
    sub->add_option_function<std::string>(
           "--progress", [&g](const std::string& m) { g.progress = parse_progress_mode(m); },
           "Progress on stderr: auto (a line on a terminal, plain lines in a log, none with "
           "--json), tty, plain, json (one object a line) or none")
        ->check(CLI::IsMember({"auto", "tty", "plain", "json", "none"}));
    runners.emplace_back(sub, fn(*sub, g));
  };
  add("inspect",
      "Describe a checkpoint: format, MoE layers, tensors, and the backend the oracle picks",
      add_inspect);
  add("convert", "Write a backend-ready checkpoint (safetensors + index + config + moepack.json)",
      add_convert);
  add("merge",
      "Assemble the parts of `convert --shard I/N` into the output a single convert writes",
      add_merge);
  add("verify",
      "Prove a converted checkpoint right: integrity, exact round-trip, fused MoE vs reference",
      add_verify);
  add("synth",
      "Write a realistic random MoE checkpoint in a source format (--format: every one but "
      "compressed-tensors MXFP8)",
      add_synth);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string hint = parse_suggestion(app, argc, argv);
    if (hint.empty()) hint = choice_suggestion(e.what());
    if (json_requested(argc, argv))
      print_json_error(static_cast<int>(ExitCode::kUsage), "usage",
                       e.what() + (hint.empty() ? "" : "; " + hint));
    app.exit(e);
    if (!hint.empty()) std::cerr << "moepack: " << hint << "\n";
    return static_cast<int>(ExitCode::kUsage);
  }
  for (auto& [sub, runner] : runners)
    if (sub->parsed()) return runner();
  return static_cast<int>(ExitCode::kUsage);
}

}  // namespace
}  // namespace moepack::cli

int main(int argc, char** argv) {
  using namespace moepack;
  keep_freed_memory_for_reuse();
  cli::remove_outputs_on_fatal_signals();
  cli::Globals g;
  const bool json = cli::json_requested(argc, argv);
  try {
    return cli::run(argc, argv, g);
  } catch (const Error& e) {
    const int code = static_cast<int>(e.exit_code());
    // A rejected choice (--format, --backend, --vllm-target, --target-arch, ...) near a valid one.
    const std::string hint =
        e.code() == ErrorCode::kUsage ? cli::choice_suggestion(e.message()) : std::string();
    if (g.json || json)
      cli::print_json_error(code, error_code_name(e.code()),
                            e.message() + (hint.empty() ? "" : "; " + hint), e.file(), e.tensor());
    std::cerr << "moepack: error: " << e.what() << (hint.empty() ? "" : "; " + hint) << "\n";
    return code;
  } catch (const std::bad_alloc&) {
    // No allocation here: the message is a constant and stderr is unbuffered.
    if (json) cli::print_json_error(static_cast<int>(ExitCode::kIo), "io", cli::kOutOfMemory);
    std::fputs("moepack: error: ", stderr);
    std::fputs(cli::kOutOfMemory, stderr);
    std::fputs("\n", stderr);
    return static_cast<int>(ExitCode::kIo);
  } catch (const std::system_error& e) {
    // A thread that cannot be started (EAGAIN: memory for its stack, or a thread limit).
    const bool resources = e.code() == std::errc::resource_unavailable_try_again ||
                           e.code() == std::errc::not_enough_memory;
    const std::string message =
        resources ? std::string(cli::kOutOfMemory) + " (" + e.what() + ")" : e.what();
    const int code = static_cast<int>(resources ? ExitCode::kIo : ExitCode::kInternal);
    if (json) cli::print_json_error(code, resources ? "io" : "internal", message);
    std::cerr << "moepack: " << (resources ? "error: " : "internal error: ") << message << "\n";
    return code;
  } catch (const std::exception& e) {
    if (json) cli::print_json_error(static_cast<int>(ExitCode::kInternal), "internal", e.what());
    std::cerr << "moepack: internal error: " << e.what() << "\n";
    return static_cast<int>(ExitCode::kInternal);
  }
}

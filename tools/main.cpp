// moepack: ahead-of-time conversion of quantized MoE checkpoints into backend-ready layouts.
// Exit codes (README.md): 0 ok, 1 verification failed, 2 usage, 3 invalid input,
// 4 unsupported, 5 I/O, 70 internal error.
#include <unistd.h>

#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "core/memory.h"
#include "core/version.h"
#include "tools/cli.h"

namespace moepack::cli {

bool stderr_is_terminal() {
  return isatty(STDERR_FILENO) == 1;
}

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(2) << std::endl;
}

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u ? "%.1f %s" : "%.0f %s", v, units[u]);
  return buf;
}

}  // namespace moepack::cli

int main(int argc, char** argv) {
  using namespace moepack;
  keep_freed_memory_for_reuse();
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

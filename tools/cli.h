// The moepack CLI: parsing and reporting only (STYLE.md §11). Each subcommand file registers its
// options on a CLI11 subcommand and returns a callback that does the work through the pipeline,
// verify and synth tiers.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "pipeline/progress.h"  // human_bytes

namespace moepack::cli {

struct Globals {
  bool json = false;                            // --json: machine-readable result on stdout
  ProgressMode progress = ProgressMode::kAuto;  // --progress (pipeline/progress.h)
};

using Runner = std::function<int()>;  // returns the exit code

Runner add_inspect(CLI::App& app, Globals& g);
Runner add_convert(CLI::App& app, Globals& g);
Runner add_verify(CLI::App& app, Globals& g);
Runner add_synth(CLI::App& app, Globals& g);
Runner add_merge(CLI::App& app, Globals& g);

// CLI11 validators for numbers (the message names the flag: "--threads: must be 0 or more, got
// -3"): an integer of at least `min`, a finite real of at least `min`.
CLI::Validator integer_at_least(long long min);
CLI::Validator real_at_least(double min);

// A command's checkpoint argument (inspect's DIR, convert's SRC, verify's and merge's --source)
// as a directory to read: a Hugging Face hub id or cache repo root resolved offline to its
// snapshot (model/hf_hub.h), anything else unchanged. A resolution is said on stderr (text
// mode) so that the directory read is never a surprise.
std::string resolve_checkpoint_arg(const std::string& arg, const Globals& g);

// Whether stderr is a terminal (--progress auto: an updating line there, plain lines elsewhere).
bool stderr_is_terminal();
void print_json(const nlohmann::json& j);

}  // namespace moepack::cli

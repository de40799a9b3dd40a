// `moepack verify`: integrity, exact round-trip against the source, and the fused MoE computed
// directly from the backend layout against a reference from the dequantised source.
#pragma once

#include <cstdint>
#include <string>

#include "pipeline/progress.h"
#include "verify/verify_report.h"

namespace moepack {

struct VerifyOptions {
  std::string dst;
  std::string source;  // "" = no round-trip; the reference then comes from decoding DST
  int64_t tokens = kDefaultVerifyTokens;
  uint64_t seed = kDefaultVerifySeed;
  double tolerance = kDefaultVerifyTolerance;
  std::string device = "cpu";
  int threads = 0;
  // Experts of a layer checked at once, as canonical bytes: the rule and default of convert's
  // --chunk-size, so verify's memory is bounded like convert's (one chunk, not one layer).
  uint64_t chunk_bytes = 1ull << 30;
  // Called as the layers are checked (layers done, and the bytes of the layers' parameters
  // checked so far: by chunks of experts within a layer), from one thread at a time; the last
  // call has every layer done. Empty: no calls.
  ProgressFn progress;
  // Integrity and the exact round trip only: no router, no activation, no MoE output (for a
  // model whose router or activation moepack cannot compute). The report says so.
  bool skip_numerical = false;
};

// Runs every check and returns the report (report.passed says the verdict). Throws Error for
// inputs it cannot read (exit 3/5), never for a failed check.
VerifyReport run_verify(const VerifyOptions& opts);

}  // namespace moepack

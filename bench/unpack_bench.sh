#!/usr/bin/env bash
# The Marlin row's unpack per thread, word-at-a-time against the scalar definition, and the
# nibble pack of the canonical codes (build/bin/moepack_unpack_bench, bench/unpack_bench.cpp):
# one chunk of EXPERTS experts of a Qwen3-30B-A3B-shaped layer, best of REPEATS, thread CPU time.
# Prints the machine and the load average before and after.
#
#   bench/unpack_bench.sh [BENCH_BINARY] [EXPERTS] [REPEATS]
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-$here/build/bin/moepack_unpack_bench}
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$B" "${2:-4}" "${3:-8}"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

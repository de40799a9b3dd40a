#!/usr/bin/env bash
# Fuzzing at scale: every libFuzzer target of a MOEPACK_FUZZ build, run in parallel to a given
# number of executions each, from the committed seed corpora (tests/fuzz/corpus/<target>) with
# their dictionaries (tests/fuzz/dict/<target>.dict). fuzz_unpack runs once per source codec
# (MOEPACK_FUZZ_CODEC=<row>), each its own target. CI's short run is tests/fuzz/run_fuzz.sh.
#
#   bench/fuzz.sh BIN_DIR RUNS OUT [JOBS] [MAX_SECONDS]
#
# BIN_DIR holds the fuzz_* binaries; RUNS is -runs=N per target (10000000 for the issue's 10 M);
# JOBS targets run at once (default: nproc); MAX_SECONDS bounds each (-max_total_time; default
# none). Under OUT: one log per target, its grown corpus, any finding (crash-*, leak-*,
# timeout-*, oom-*; copied under OUT/regressions/ in tests/fuzz/regressions' layout), and
# summary.tsv / summary.md: executions, seconds, exec/s, coverage (cov and
# ft from libFuzzer's final stats), corpus size and findings per target. Exit 1 on any finding.
# Where the repository is not next to BIN_DIR (the device's .fuzz/ carry), FUZZ_DATA names the
# folder holding corpus/ and dict/ (default: tests/fuzz beside this script). FORKS="NAME=K ..."
# runs target NAME (as the summary names it: moe_discovery, unpack_gptq, ...) in libFuzzer's fork
# mode on K processes (-fork=K; -runs then bounds their sum), so that a slow target gets more
# cores; JOBS counts targets, not processes, so size JOBS + the extra forks to the cores.
set -uo pipefail
bin=$(realpath "${1:?usage: fuzz.sh BIN_DIR RUNS OUT [JOBS] [MAX_SECONDS]}")
runs=${2:?RUNS}
out=${3:?OUT}
jobs=${4:-$(nproc)}
max=${5:-0}
here=$(cd "$(dirname "$0")" && pwd)
data=${FUZZ_DATA:-$here/../tests/fuzz}
mkdir -p "$out"
out=$(realpath "$out")

# Source codec rows for fuzz_unpack, as the binary's registry lists them (formats/registry.cpp
# source_codecs()), so that a new row is fuzzed without editing this script.
codecs=$(MOEPACK_FUZZ_CODEC=list "$bin/fuzz_unpack") || { echo "fuzz_unpack: no codec list" >&2; exit 2; }
targets=()
for t in safetensors index hf_config quant_config manifest part_json moe_discovery; do
  targets+=("$t")
done
for c in $codecs; do targets+=("unpack:$c"); done

run_one() {  # target[:codec]
  local spec=$1 t=${1%%:*} codec=""
  [[ $spec == *:* ]] && codec=${spec#*:}
  local name=$t${codec:+_$codec}
  local dir=$out/$name
  mkdir -p "$dir/corpus" "$dir/findings"
  cp "$data/corpus/$t/"* "$dir/corpus/" 2>/dev/null
  local dict=()
  [ -f "$data/dict/$t.dict" ] && dict=("-dict=$data/dict/$t.dict")
  local limit=()
  [ "$max" != 0 ] && limit=("-max_total_time=$max")
  local forks
  forks=$(tr ' ' '\n' <<<"${FORKS:-}" | awk -F= -v n="$name" '$1 == n { print $2 }')
  [ -n "$forks" ] && [ "$forks" -gt 1 ] && limit+=("-fork=$forks")
  local t0 t1
  t0=$(date +%s.%N)
  MOEPACK_FUZZ_CODEC=$codec "$bin/fuzz_$t" "$dir/corpus" "${dict[@]}" "-runs=$runs" "${limit[@]}" \
    -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 -artifact_prefix="$dir/findings/" \
    >"$dir/log.txt" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  echo "$rc $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" >"$dir/status"
}
export -f run_one
export out data runs max bin FORKS

printf '%s\n' "${targets[@]}" | xargs -P "$jobs" -I{} bash -c 'run_one {}'

# Findings in the layout of tests/fuzz/regressions (each a reproducer the replay tests run through
# the same entry point; a pinned codec's under MOEPACK_FUZZ_CODEC=<row>/): copy OUT/regressions/*
# into tests/fuzz/regressions/ and the finding is a failing test until it is fixed.
for spec in "${targets[@]}"; do
  t=${spec%%:*}
  codec=""
  [[ $spec == *:* ]] && codec=${spec#*:}
  src=$out/$t${codec:+_$codec}/findings
  dst=$out/regressions/$t${codec:+/MOEPACK_FUZZ_CODEC=$codec}
  if [ -n "$(ls -A "$src" 2>/dev/null)" ]; then mkdir -p "$dst" && cp "$src"/* "$dst/"; fi
done

# Summary: executions (stat::number_of_executed_units), time, exec/s, cov and ft of libFuzzer's
# last status line, corpus entries, findings.
status=0
{
  printf 'target\texecutions\tseconds\texec_per_s\tcov\tft\tcorpus\tfindings\trc\n'
  for spec in "${targets[@]}"; do
    t=${spec%%:*}
    codec=""
    [[ $spec == *:* ]] && codec=${spec#*:}
    name=$t${codec:+_$codec}
    dir=$out/$name
    read -r rc secs <"$dir/status"
    # Fork mode prints no final stats: its last status line (#N: ...) counts every process' runs.
    execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/log.txt" | tail -1 | awk '{print $2}')
    last=$(grep -E '^#[0-9]+' "$dir/log.txt" | tail -1)
    [ -n "$execs" ] || execs=$(echo "$last" | grep -oE '^#[0-9]+' | tr -d '#')
    cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
    ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
    corpus=$(find "$dir/corpus" -type f | wc -l)
    findings=$(find "$dir/findings" -type f | wc -l)
    rate=$(awk -v e="${execs:-0}" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? e / s : 0) }')
    printf '%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "${execs:-0}" "$secs" "$rate" \
      "${cov:-?}" "${ft:-?}" "$corpus" "$findings" "$rc"
    if [ "$findings" != 0 ] || [ "$rc" != 0 ]; then status=1; fi
  done
} >"$out/summary.tsv"
{
  echo "| target | executions | seconds | exec/s | cov | ft | corpus | findings | rc |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  tail -n +2 "$out/summary.tsv" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9 }'
} >"$out/summary.md"
cat "$out/summary.md"
exit $status

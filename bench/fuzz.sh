#!/usr/bin/env bash
# Fuzzing at scale: every libFuzzer target of a MOEPACK_FUZZ build, all at once, to a given number
# of executions each, from the committed seed corpora (tests/fuzz/corpus/<target>) with their
# dictionaries (tests/fuzz/dict/<target>.dict). fuzz_unpack runs once per source codec row
# (MOEPACK_FUZZ_CODEC=<row>, the rows the binary lists), each its own target. CI's short run is
# tests/fuzz/run_fuzz.sh.
#
#   bench/fuzz.sh BIN_DIR RUNS OUT [CORES] [MAX_SECONDS] [ROUND_SECONDS]
#
# BIN_DIR holds the fuzz_* binaries; RUNS is the executions wanted per target (10000000 for the
# issue's 10 M); CORES the cores to fill (default: nproc); MAX_SECONDS bounds the whole run
# (default 0: none, one round to RUNS). With MAX_SECONDS the run goes in rounds of ROUND_SECONDS
# (default: all of it): each round runs every target still short of RUNS at once, each on
# CORES / targets processes (libFuzzer's fork mode when that is more than one), resuming from its
# grown corpus; a target that reached RUNS or found something leaves, so the later rounds give the
# slow targets the cores the fast ones freed. Under OUT: per target its logs (one per round), its
# grown corpus and any finding (crash-*, leak-*, timeout-*, oom-*; also copied under
# OUT/regressions/ in tests/fuzz/regressions' layout, tests/fuzz/README.md), and
# summary.tsv / summary.md: executions, seconds fuzzed, exec/s, coverage (cov and ft of
# libFuzzer's last status line), corpus size, findings and rounds per target. Exit 1 on any
# finding. Where the repository is not next to BIN_DIR (the device's .fuzz/ carry), FUZZ_DATA
# names the folder holding corpus/ and dict/ (default: tests/fuzz beside this script).
set -uo pipefail
bin=$(realpath "${1:?usage: fuzz.sh BIN_DIR RUNS OUT [CORES] [MAX_SECONDS] [ROUND_SECONDS]}")
runs=${2:?RUNS}
out=${3:?OUT}
cores=${4:-$(nproc)}
max=${5:-0}
round_s=${6:-$max}
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
# TARGETS (an extended regex on the target's name, e.g. 'manifest|unpack_gptq') runs a subset.
if [ -n "${TARGETS:-}" ]; then
  picked=()
  for spec in "${targets[@]}"; do
    n=${spec%%:*}; [[ $spec == *:* ]] && n="${n}_${spec#*:}"
    [[ $n =~ ^(${TARGETS})$ ]] && picked+=("$spec")
  done
  targets=("${picked[@]}")
fi

name_of() { local t=${1%%:*} codec=""; [[ $1 == *:* ]] && codec=${1#*:}; echo "$t${codec:+_$codec}"; }

# Executions of one round's log: libFuzzer's final stats, or in fork mode (no final stats) the
# last status line's #N, which counts every process' runs.
round_execs() {
  local n
  n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$1" | tail -1 | awk '{print $2}')
  [ -n "$n" ] || n=$(grep -oE '^#[0-9]+' "$1" | tail -1 | tr -d '#')
  echo "${n:-0}"
}

run_one() {  # target[:codec] round forks seconds runs_left
  local spec=$1 r=$2 forks=$3 secs=$4 left=$5 t=${1%%:*} codec=""
  [[ $spec == *:* ]] && codec=${spec#*:}
  local dir=$out/$t${codec:+_$codec}
  local dict=() limit=()
  [ -f "$data/dict/$t.dict" ] && dict=("-dict=$data/dict/$t.dict")
  [ "$secs" != 0 ] && limit+=("-max_total_time=$secs")
  [ "$forks" -gt 1 ] && limit+=("-fork=$forks")
  local t0 t1
  t0=$(date +%s.%N)
  MOEPACK_FUZZ_CODEC=$codec "$bin/fuzz_$t" "$dir/corpus" "${dict[@]}" "-runs=$left" "${limit[@]}" \
    -rss_limit_mb=4096 -timeout=30 -print_final_stats=1 -artifact_prefix="$dir/findings/" \
    >"$dir/log-r$r.txt" 2>&1
  local rc=$?
  t1=$(date +%s.%N)
  echo "$rc $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')" >"$dir/status-r$r"
}
export -f run_one
export out data bin

for spec in "${targets[@]}"; do
  dir=$out/$(name_of "$spec")
  mkdir -p "$dir/corpus" "$dir/findings"
  cp "$data/corpus/${spec%%:*}/"* "$dir/corpus/" 2>/dev/null
  echo "0 0 0 0" >"$dir/total"  # executions, seconds, rounds, last rc
  # RESUME_FROM: an earlier run's OUT (its summary.tsv and fuzz-corpora.tar.gz unpacked there):
  # each target goes on from its grown corpus, and its executions, seconds and rounds so far
  # count towards RUNS (the summary then reports both runs together).
  if [ -n "${RESUME_FROM:-}" ]; then
    [ -d "$RESUME_FROM/$(name_of "$spec")/corpus" ] &&
      cp "$RESUME_FROM/$(name_of "$spec")/corpus/"* "$dir/corpus/" 2>/dev/null
    awk -F'\t' -v n="$(name_of "$spec")" '$1 == n { print $2, $3, $9, 0 }' \
      "$RESUME_FROM/summary.tsv" 2>/dev/null | grep . >"$dir/total.prev" && mv "$dir/total.prev" "$dir/total"
    rm -f "$dir/total.prev"
  fi
done

start=$(date +%s)
r=0
while :; do
  left=()
  for spec in "${targets[@]}"; do
    dir=$out/$(name_of "$spec")
    read -r execs _ _ rc <"$dir/total"
    [ "$execs" -ge "$runs" ] || [ -n "$(ls -A "$dir/findings")" ] || [ "$rc" != 0 ] || left+=("$spec")
  done
  [ ${#left[@]} -gt 0 ] || break
  secs=0
  if [ "$max" != 0 ]; then
    remaining=$((max - ($(date +%s) - start)))
    [ "$remaining" -ge 20 ] || break  # too little for a round: startup would dominate
    secs=$((remaining < round_s ? remaining : round_s))
  fi
  forks=$((cores / ${#left[@]}))
  [ "$forks" -ge 1 ] || forks=1
  r=$((r + 1))
  echo "round $r: ${#left[@]} targets, $forks process(es) each, ${secs}s" >&2
  for spec in "${left[@]}"; do
    dir=$out/$(name_of "$spec")
    read -r execs _ _ _ <"$dir/total"
    echo "$spec $r $forks $secs $((runs - execs))"
  done | xargs -P "${#left[@]}" -L 1 bash -c 'run_one "$@"' _
  for spec in "${left[@]}"; do
    dir=$out/$(name_of "$spec")
    read -r execs fuzzed rounds _ <"$dir/total"
    read -r rc s <"$dir/status-r$r"
    echo "$((execs + $(round_execs "$dir/log-r$r.txt"))) $(awk -v a="$fuzzed" -v b="$s" 'BEGIN { print a + b }') $((rounds + 1)) $rc" >"$dir/total"
  done
  [ "$max" != 0 ] || break
done

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

# Summary: executions (all rounds), seconds fuzzed, exec/s, cov and ft of libFuzzer's last status
# line, corpus entries, findings, rounds, the last round's exit code.
status=0
{
  printf 'target\texecutions\tseconds\texec_per_s\tcov\tft\tcorpus\tfindings\trounds\trc\n'
  for spec in "${targets[@]}"; do
    name=$(name_of "$spec")
    dir=$out/$name
    read -r execs secs rounds rc <"$dir/total"
    last=$(cat "$dir"/log-r*.txt 2>/dev/null | grep -E '^#[0-9]+' | tail -1)
    cov=$(echo "$last" | grep -o 'cov: [0-9]*' | awk '{print $2}')
    ft=$(echo "$last" | grep -o 'ft: [0-9]*' | awk '{print $2}')
    corpus=$(find "$dir/corpus" -type f | wc -l)
    findings=$(find "$dir/findings" -type f | wc -l)
    rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN { printf "%.0f", (s > 0 ? e / s : 0) }')
    printf '%s\t%s\t%.1f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$execs" "$secs" "$rate" \
      "${cov:-?}" "${ft:-?}" "$corpus" "$findings" "$rounds" "$rc"
    if [ "$findings" != 0 ] || [ "$rc" != 0 ]; then status=1; fi
  done
} >"$out/summary.tsv"
{
  echo "| target | executions | seconds | exec/s | cov | ft | corpus | findings | rounds | rc |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  tail -n +2 "$out/summary.tsv" | awk -F'\t' '{ printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 }'
} >"$out/summary.md"
cat "$out/summary.md"
exit $status

#!/usr/bin/env bash
# Runs every libFuzzer target of a MOEPACK_FUZZ build, one after the other, and fails on the
# first finding (crash, sanitizer report, uncaught exception, timeout, out of memory).
#
#   tests/fuzz/run_fuzz.sh BUILD_FUZZ_DIR [SECONDS_PER_TARGET | -runs=N] [MOEPACK_BIN]
#
# Seeds: the committed corpora (tests/fuzz/corpus/<target>, with tests/fuzz/dict/<target>.dict),
# plus real files written by MOEPACK_BIN (synth + convert: config.json, the index, moepack.json,
# a part.json, a shard) and hand-made discovery records (seed_discovery.py), so that the mutations
# start from meaningful inputs. fuzz_unpack runs over every source codec (its first byte picks
# the row). Prints libFuzzer's final stats (number_of_executed_units) per target. The long run
# (millions of executions per target, each codec its own target) is bench/fuzz.sh.
set -euo pipefail
build=${1:?usage: run_fuzz.sh BUILD_FUZZ_DIR [SECONDS | -runs=N] [MOEPACK_BIN]}
limit=${2:-20}
bin=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/moepack-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
if [[ $limit == -runs=* ]]; then budget=("$limit"); else budget=("-max_total_time=$limit"); fi

targets="safetensors quant_config hf_config index manifest moe_discovery part_json unpack"
for t in $targets; do
  mkdir -p "$work/corpus/$t"
  cp "$here/corpus/$t/"* "$work/corpus/$t/" 2>/dev/null || true
done
if [[ -n $bin && -x $bin ]]; then
  "$bin" synth "$work/src" --format gptq --layers 2 --experts 4 --hidden 128 --inter 128 \
    --max-shard-size 100KB --threads 1 >/dev/null
  "$bin" convert "$work/src" "$work/dst" --threads 1 >/dev/null
  "$bin" convert "$work/src" "$work/dst" --threads 1 --shard 1/2 >/dev/null
  cp "$work/dst.parts/1-of-2/part.json" "$work/corpus/part_json/generated.part.json"
  cp "$work/src/config.json" "$work/corpus/hf_config/"
  python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["quantization_config"]))' \
    "$work/src/config.json" >"$work/corpus/quant_config/gptq.json"
  cp "$work/src/model.safetensors.index.json" "$work/corpus/index/"
  cp "$work/dst/moepack.json" "$work/corpus/manifest/"
  head -c 65536 "$(ls "$work"/src/*.safetensors | head -1)" >"$work/corpus/safetensors/shard"
fi
python3 "$here/seed_discovery.py" "$work/corpus/moe_discovery"

status=0
for t in $targets; do
  echo "== fuzz_$t ${budget[*]}"
  dict=()
  [ -f "$here/dict/$t.dict" ] && dict=("-dict=$here/dict/$t.dict")
  if ! "$build/bin/fuzz_$t" "${budget[@]}" "${dict[@]}" -rss_limit_mb=4096 -timeout=30 \
      -print_final_stats=1 -artifact_prefix="$work/" "$work/corpus/$t" 2>"$work/$t.log"; then
    status=1
    tail -n 60 "$work/$t.log"
    mkdir -p fuzz-findings && cp "$work"/crash-* "$work"/timeout-* "$work"/oom-* fuzz-findings/ 2>/dev/null || true
  fi
  grep -E "stat::number_of_executed_units|stat::peak_rss_mb|Done [0-9]+ runs" "$work/$t.log" || true
done
exit $status

#!/usr/bin/env bash
# Prints the SHA-256 of every file `moepack convert` writes, for every source format x naming
# family that `moepack synth` makes (and the bf16 ones through --quantize mxfp8), so that two
# builds can be compared byte for byte:
#   bench/convert_bytes.sh OLD/bin/moepack > old.txt; bench/convert_bytes.sh NEW/bin/moepack > new.txt
#   diff old.txt new.txt
# Usage: bench/convert_bytes.sh MOEPACK [WORKDIR]
# MOEPACK_CONVERT_FLAGS (e.g. "--vllm-target 2026-05") is added to every convert, to compare a
# build with targets against one from before them. MOEPACK_KEEP_JSON=DIR keeps each conversion's
# config.json and moepack.json as DIR/FORMAT/FAMILY/VARIANT/ (bench/compare_manifests.sh compares
# two builds' JSON with the keys one of them added removed).
set -euo pipefail
bin=$(realpath "$1")
work=${2:-$(mktemp -d)}
mkdir -p "$work"
# Every --format synth makes, as its --help lists them ("--format TEXT REQUIRED bf16|gptq|...").
formats=$("$bin" synth --help | awk '$1 == "--format" { print $NF; exit }' | tr '|' ' ')
[ -n "$formats" ] || { echo "could not read the synth formats from $bin synth --help" >&2; exit 1; }
families="qwen3 mixtral deepseek fused3d"
# gpt-oss is its own family and format (a build that synthesizes it).
case " $formats " in *" gpt-oss-mxfp4 "*) families="$families gpt_oss" ;; esac
for fam in $families; do
  for fmt in $formats; do
    [ "$fam" = fused3d ] && [ "$fmt" != bf16 ] && continue
    # gpt-oss-mxfp4 only as gpt_oss, and gpt_oss only as it (its bf16 variant is not converted).
    { [ "$fam" = gpt_oss ] || [ "$fmt" = gpt-oss-mxfp4 ]; } &&
      { [ "$fam" != gpt_oss ] || [ "$fmt" != gpt-oss-mxfp4 ]; } && continue
    src="$work/src-$fmt-$fam"
    "$bin" synth "$src" --format "$fmt" --family "$fam" --layers 2 --experts 4 \
      --hidden 256 --inter 128 --seed 7 --force >/dev/null
    flags=()
    [ "$fmt" = bf16 ] && flags=(--quantize mxfp8)
    case $fmt in modelopt-mxfp8 | fp8-block | ct-fp8-block | bf16) flags+=(--target-arch sm100) ;; esac
    # Every conversion also in chunks of experts and several shards: same bytes per tensor.
    variants=("default:" "chunked:--chunk-size 100KB --max-shard-size 300KB")
    case $fmt in
      gptq | awq | ct-w4a16) variants+=("triton:--backend triton-wna16" "fp16:--act-dtype fp16") ;;
      gptq-asym) variants+=("fp16:--act-dtype fp16") ;;
      gptq-actorder) variants+=("vllm-scale:--vllm-w13-scale-size-k") ;;
      gpt-oss-mxfp4) variants+=("marlin:--backend marlin-mxfp4" "trtllm:--target-arch sm100") ;;
    esac
    for v in "${variants[@]}"; do
      name=${v%%:*}
      extra=${v#*:}
      dst="$work/dst-$fmt-$fam-$name"
      # A conversion the target refuses (act-order for vLLM 0.33: exit 4) is part of the
      # comparison too: its exit code and first error line, never a silent stop of the script.
      rc=0
      # shellcheck disable=SC2086
      "$bin" convert "$src" "$dst" --force "${flags[@]}" $extra ${MOEPACK_CONVERT_FLAGS:-} \
        >/dev/null 2>"$work/err" || rc=$?
      if [ "$rc" != 0 ]; then
        echo "exit $rc: $(head -n 1 "$work/err" | sed "s|$work|WORK|g")  $fmt/$fam/$name"
        [ "$rc" = 4 ] || { cat "$work/err" >&2; exit 1; }
        continue
      fi
      (cd "$dst" && find . -type f | LC_ALL=C sort | xargs sha256sum) |
        sed "s|  \./|  $fmt/$fam/$name/|"
      if [ -n "${MOEPACK_KEEP_JSON:-}" ]; then
        mkdir -p "$MOEPACK_KEEP_JSON/$fmt/$fam/$name"
        cp "$dst/config.json" "$dst/moepack.json" "$MOEPACK_KEEP_JSON/$fmt/$fam/$name/"
      fi
    done
    rm -rf "$src" "$work"/dst-"$fmt"-"$fam"-*
  done
done

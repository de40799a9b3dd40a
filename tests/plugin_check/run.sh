#!/usr/bin/env bash
# `moepack-vllm check DIR` (integrations/vllm/moepack_vllm/check.py) with the system python and
# no vLLM: a served artifact is exit 0 saying how, one for another vLLM line, an unserved
# layout or another TP degree is exit 4 with the plugin's refusal, a TP 2 / EP 2 artifact is
# served at its own degree only, and neither vllm nor torch is imported. Usage: run.sh MOEPACK_BIN SOURCE_DIR
set -euo pipefail
bin=$1
src_dir=$2
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
small="--layers 2 --experts 4 --hidden 256 --inter 128"
"$bin" synth "$tmp/gptq" --format gptq $small >/dev/null
"$bin" synth "$tmp/w8a8" --format ct-w8a8 $small >/dev/null
"$bin" convert "$tmp/gptq" "$tmp/served" >/dev/null 2>&1
"$bin" convert "$tmp/gptq" "$tmp/other-line" --vllm-target 2026-05 >/dev/null 2>&1
"$bin" convert "$tmp/w8a8" "$tmp/unserved" >/dev/null 2>&1
"$bin" synth "$tmp/gptq256" --format gptq --layers 2 --experts 4 --hidden 256 --inter 256 >/dev/null
"$bin" convert "$tmp/gptq256" "$tmp/tp2" --backend marlin --tensor-parallel-size 2 >/dev/null 2>&1
"$bin" convert "$tmp/gptq256" "$tmp/ep2" --backend marlin --expert-parallel 2 >/dev/null 2>&1
check() {  # DIR [ARGS...] -> prints rc, stdout, stderr
  PYTHONPATH="$src_dir/integrations/vllm" python3 - "$@" <<'PY'
import sys
from moepack_vllm import check
rc = check.main(["check"] + sys.argv[1:])
assert "vllm" not in sys.modules and "torch" not in sys.modules, "imported vLLM or torch"
sys.exit(rc)
PY
}
expect() {  # WANT_RC WANT_TEXT DIR [ARGS...]
  local want=$1 text=$2 rc=0 out
  shift 2
  out=$(check "$@" 2>&1) || rc=$?
  if [[ $rc != "$want" || $out != *"$text"* ]]; then
    echo "FAIL: check $*: exit $rc (want $want), output: $out (want: $text)"
    exit 1
  fi
  echo "ok: check $*: exit $rc: $out"
}
expect 0 "servable by moepack-vllm in vLLM 0.33" "$tmp/served"
expect 4 "vllm_target '2026-05'" "$tmp/other-line"
expect 4 'serving.path "none"' "$tmp/unserved"
expect 4 "tensor_parallel_size=1, the engine runs 2" "$tmp/served" --tensor-parallel-size 2
expect 4 "tensor_parallel_size=1, the engine runs expert parallelism" "$tmp/served" --enable-expert-parallel
expect 0 "tensor_parallel_size 2, no expert parallelism, each rank reading its own expert files" \
  "$tmp/tp2" --tensor-parallel-size 2
expect 4 "written for tensor_parallel_size=2, the engine runs 4" "$tmp/tp2" --tensor-parallel-size 4
expect 0 "expert parallelism over 2 ranks (linear placement" "$tmp/ep2" --tensor-parallel-size 2 \
  --enable-expert-parallel
expect 4 "written for expert parallelism over 2 ranks (--enable-expert-parallel), the engine runs \
tensor_parallel_size=2 without expert parallelism" "$tmp/ep2" --tensor-parallel-size 2
expect 4 "not a moepack artifact" "$tmp/gptq"

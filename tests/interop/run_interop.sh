#!/usr/bin/env bash
# Interoperability with Hugging Face's `safetensors` reader: synthesise tiny checkpoints with
# moepack, convert them, and load every output with check_hf_load.py. Exit 77 (ctest SKIP) when
# the Python packages are missing. Usage: run_interop.sh [path/to/moepack]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../../build/bin/moepack}"

if ! python3 -c "import safetensors, numpy" 2>/dev/null; then
  echo "SKIP: python3 cannot import safetensors and numpy (pip install safetensors numpy)"
  exit 77
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
run() { echo "+ $*"; "$@"; }

# GPTQ (I32/F16 tensors numpy can hold, bf16 copy-through) -> Marlin, one file and sharded.
run "$bin" synth "$tmp/gptq" --format gptq --layers 2 --experts 4 --hidden 256 --inter 128 --seed 3
run "$bin" convert "$tmp/gptq" "$tmp/gptq-marlin" --backend marlin --target-arch sm90
run "$bin" convert "$tmp/gptq" "$tmp/gptq-marlin-sharded" --backend marlin --target-arch sm90 \
  --max-shard-size 200KB
# bf16 -> MXFP8 (F8_E4M3 and E8M0 bytes numpy cannot hold; checked via the raw bytes/torch).
run "$bin" synth "$tmp/bf16" --format bf16 --layers 2 --experts 4 --hidden 256 --inter 128 --seed 4
run "$bin" convert "$tmp/bf16" "$tmp/bf16-mxfp8" --quantize mxfp8 --target-arch sm100

run python3 "$here/check_hf_load.py" "$tmp/gptq" "$tmp/gptq-marlin" "$tmp/gptq-marlin-sharded" \
  "$tmp/bf16" "$tmp/bf16-mxfp8"

# The check must be able to fail: a shard with one trailing byte, and a manifest whose recorded
# shape disagrees with the file, are both rejected.
cp -r "$tmp/gptq-marlin" "$tmp/broken-trailing"
printf 'x' >>"$tmp/broken-trailing/model.safetensors"
if python3 "$here/check_hf_load.py" "$tmp/broken-trailing" >"$tmp/log" 2>&1; then
  echo "FAIL: check_hf_load.py accepted a shard with a trailing byte"; cat "$tmp/log"; exit 1
fi
cp -r "$tmp/gptq-marlin" "$tmp/broken-manifest"
python3 - "$tmp/broken-manifest/moepack.json" <<'PY'
import json, sys
p = sys.argv[1]
m = json.load(open(p))
name = next(n for n in m["tensors"] if n.endswith("w13_qweight"))
m["tensors"][name]["shape"][-1] += 1
json.dump(m, open(p, "w"))
PY
if python3 "$here/check_hf_load.py" "$tmp/broken-manifest" >"$tmp/log" 2>&1; then
  echo "FAIL: check_hf_load.py accepted a manifest that disagrees with the file"; cat "$tmp/log"; exit 1
fi
echo "interop OK"

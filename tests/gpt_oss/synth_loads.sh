#!/usr/bin/env bash
# ctest entry `gpt_oss_synth_transformers`: `moepack synth` writes gpt-oss checkpoints (MXFP4 and
# bf16) that transformers' GptOssForCausalLM loads as the published ones (synth_loads.py).
#   tests/gpt_oss/synth_loads.sh MOEPACK_BIN [VENV]
# Needs a python with torch, safetensors and transformers: the vLLM test venv (exit 77 = skipped,
# with a message, without it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
venv=${2:-${MOEPACK_VLLM_VENV:-$HOME/.cache/moepack/venv-vllm-0.33.0}}
py=$venv/bin/python
if ! [ -x "$py" ] || ! "$py" -c "import torch, safetensors, transformers" 2>/dev/null; then
  echo "SKIP: no python with torch, safetensors and transformers at $venv"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Two shards, 3 layers (sliding and full attention), H != I, an odd expert count.
"$bin" synth "$work/mxfp4" --format gpt-oss-mxfp4 --layers 3 --experts 5 --hidden 128 --inter 96 \
  --top-k 2 --seed 11 --max-shard-size 200KB >/dev/null
"$bin" synth "$work/bf16" --family gpt_oss --format bf16 --layers 3 --experts 5 --hidden 128 \
  --inter 96 --top-k 2 --seed 11 --max-shard-size 200KB >/dev/null
HF_HUB_OFFLINE=1 "$py" "$here/synth_loads.py" "$work/mxfp4" "$work/bf16"

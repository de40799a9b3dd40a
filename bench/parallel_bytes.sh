#!/usr/bin/env bash
# Issue 25 item 5: per-rank start-up bytes of a tensor-parallel artifact against a TP-1 artifact
# that every rank would read whole, and the convert time and peak memory of both.
#   bench/parallel_bytes.sh MOEPACK_BIN WORKDIR [LAYERS] [TP] [GROUP]
# A Qwen3-235B-A22B-shaped GPTQ int4 synthetic (E 128, H 4096, I 1536, top-k 8, group GROUP,
# default 64: at TP 8, I / 8 = 192 is not a multiple of 128, which vLLM 0.33's Marlin MoE refuses
# and moepack with it) with LAYERS decoder layers (synth's qwen3 family makes layer 0 dense:
# LAYERS - 1 MoE layers; every MoE layer of the real model has the same bytes, so per-layer
# numbers scale to its 94). Prints one JSON object.
set -euo pipefail
bin=$1 work=$2 layers=${3:-2} tp=${4:-8} group=${5:-64}
mkdir -p "$work"
src=$work/src-g$group
[ -f "$src/config.json" ] || "$bin" synth "$src" --format gptq --layers "$layers" --experts 128 \
  --hidden 4096 --inter 1536 --group-size "$group" --top-k 8 --vocab 512 >/dev/null
run() {  # out flags...
  local out=$1; shift
  "$bin" convert "$src" "$out" --json --vllm-target 0.33 --backend marlin --force "$@"
}
j1=$(run "$work/tp1")
jn=$(run "$work/tp$tp" --tensor-parallel-size "$tp")
python3 - "$work/tp1" "$work/tp$tp" "$tp" "$j1" "$jn" <<'PY'
import json, sys
tp1, tpn, tp = sys.argv[1], sys.argv[2], int(sys.argv[3])
c1, cn = json.loads(sys.argv[4]), json.loads(sys.argv[5])
m1 = json.load(open(f"{tp1}/moepack.json"))
mn = json.load(open(f"{tpn}/moepack.json"))
shared = sum(t["bytes"] for t in mn["tensors"].values() if t["action"] == "copy")
whole_experts = sum(t["bytes"] for t in m1["tensors"].values() if t["action"] == "convert")
ranks = mn["parallel"]["ranks"]
per_rank = [r["tensor_bytes"] for r in ranks]
moe_layers = len(m1["layers"])
print(json.dumps({
  "moe_layers": moe_layers, "tp": tp,
  "per_moe_layer": {"tp1_expert_bytes": whole_experts // moe_layers,
                    "tpN_rank_expert_bytes": [b // moe_layers for b in per_rank]},
  "tp1_every_rank_reads_bytes": shared + whole_experts,
  "tp1_expert_bytes": whole_experts,
  "tpN_rank_reads_bytes": [shared + b for b in per_rank],
  "tpN_rank_expert_bytes": per_rank,
  "shared_bytes": shared,
  "expert_bytes_read_per_rank_ratio": max(per_rank) / whole_experts,
  "tpN_total_expert_bytes": sum(per_rank),
  "convert_tp1": {k: c1[k] for k in ("seconds", "peak_rss_anon_bytes", "peak_rss_file_bytes")},
  "convert_tpN": {k: cn[k] for k in ("seconds", "peak_rss_anon_bytes", "peak_rss_file_bytes")},
}, indent=1))
PY

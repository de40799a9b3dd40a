#!/usr/bin/env python3
"""Where is vLLM 0.33's Humming layout byte-identical to its Marlin MoE layout? (CPU only)

For every 16-bit-activation GPTQ / AWQ / compressed-tensors fixture made by make_fixtures.py,
this runs vLLM 0.33.0's own Marlin post-processing on the fixture's inputs
(oracle/int_wna16._process_weights_marlin / _process_awq_weights_marlin, i.e. the padding,
marlin_moe_permute_scales, moe_*_to_marlin_zero_points and marlin_permute_bias in torch) with the
two CUDA-only repack ops (ops.gptq_marlin_moe_repack / ops.awq_marlin_moe_repack) replaced by a
CPU encoder of the Marlin tile built from moepack's independent Marlin decoder
(tests/vllm/layouts.py tile_coords, proven against vLLM's kernel on an H100), and compares each
Humming output tensor with the Marlin tensor of the same role.

  ~/.cache/moepack/venv-vllm-0.33.0/bin/python check_marlin_relation.py FIXTURE_DIR [MOEPACK_REPO]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file

REPO = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("/work/main")
sys.path.insert(0, str(REPO / "tests" / "vllm"))
from layouts import tile_coords  # noqa: E402

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def unpack_dim0(w, bits):  # [K/pf, N] -> [K, N]
    pf = 32 // bits
    w = w.to(torch.int64) & 0xFFFFFFFF
    parts = torch.stack([(w >> (bits * i)) & ((1 << bits) - 1) for i in range(pf)], 1)
    return parts.reshape(-1, w.shape[1])


def unpack_awq_cols(w, bits):  # [K, N/8] AWQ order -> [K, N]
    w = w.to(torch.int64) & 0xFFFFFFFF
    fields = torch.stack([(w >> (4 * s)) & 0xF for s in range(8)], -1)  # [K, N/8, 8] slot order
    out = torch.empty_like(fields)
    out[..., AWQ_ORDER] = fields
    return out.reshape(w.shape[0], -1)


def marlin_encode(codes, bits):  # codes [K, N] -> Marlin words [K/16, N*16/pf]
    K, N = codes.shape
    pf, T = 32 // bits, 1024 // (32 // bits)
    dk, dn = tile_coords(bits)
    kt = torch.arange(K // 16).view(-1, 1, 1)
    nt = torch.arange(N // 64).view(1, -1, 1)
    words = torch.zeros(K // 16, N // 64, T, dtype=torch.int64)
    for f in range(pf):
        words |= codes[16 * kt + dk[:, f].view(1, 1, -1), 64 * nt + dn[:, f].view(1, 1, -1)] \
            << (bits * f)
    words = words.reshape(K // 16, -1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def fake_gptq_repack(q, size_k, size_n, num_bits, is_a_8bit=False):
    assert not is_a_8bit
    return torch.stack([marlin_encode(unpack_dim0(q[e], num_bits), num_bits)
                        for e in range(q.shape[0])])


def fake_awq_repack(q, size_k, size_n, num_bits, is_a_8bit=False):
    assert not is_a_8bit and num_bits == 4
    return torch.stack([marlin_encode(unpack_awq_cols(q[e], 4), 4) for e in range(q.shape[0])])


def marlin_layer(meta, t):
    import vllm._custom_ops as ops
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16 as o

    ops.gptq_marlin_moe_repack = fake_gptq_repack
    ops.awq_marlin_moe_repack = fake_awq_repack
    c = meta["case"]
    layer = SimpleNamespace(intermediate_size_per_partition=c["I"], num_groups_w13=0,
                            num_groups_w2=0)
    b, g = c["bits"], c["group"]
    pf = 32 // b
    if c["fmt"] == "awq":
        r = o._process_awq_weights_marlin(
            layer, b, pf, g, None, t["w13_qweight"], t["w2_qweight"], t["w13_scales"],
            t["w2_scales"], t["w13_qzeros"], t["w2_qzeros"], t.get("w13_bias"), t.get("w2_bias"))
    elif c["fmt"] == "gptq":  # AutoGPTQMoEMethod normalises to N-first first
        tr = lambda x: x.transpose(1, 2).contiguous()  # noqa: E731
        r = o._process_weights_marlin(
            layer, None, b, pf, g, tr(t["w13_qweight"]), tr(t["w2_qweight"]),
            tr(t["w13_scales"]), tr(t["w2_scales"]), None, None, t.get("w13_bias"),
            t.get("w2_bias"))
    else:  # compressed-tensors: N-first as loaded
        r = o._process_weights_marlin(
            layer, None, b, pf, g, t["w13_weight_packed"], t["w2_weight_packed"],
            t["w13_weight_scale"], t["w2_weight_scale"], t.get("w13_weight_zero_point"),
            t.get("w2_weight_zero_point"), t.get("w13_bias"), t.get("w2_bias"))
    names = ["weight", "weight", "weight_scale", "weight_scale", "zero_point", "zero_point",
             None, None, "bias", "bias"]
    subs = ["w13", "w2"] * 5
    return {f"{s}_{n}": v for s, n, v in zip(subs, names, r) if n and v is not None}


def main():
    fx = Path(sys.argv[1])
    rows = []
    for jp in sorted(fx.glob("*.json")):
        if jp.name == "index.json":
            continue
        meta = json.loads(jp.read_text())
        c = meta["case"]
        if meta["error"] or c["fmt"] not in ("gptq", "awq", "ct") or c["act"] or c["group"] == -1:
            continue
        st = load_file(str(fx / f"{c['name']}.safetensors"))
        t = {k[3:]: v for k, v in st.items() if k.startswith("in.")}
        hum = {k[4:]: v for k, v in st.items() if k.startswith("out.")}
        mar = marlin_layer(meta, t)
        cells = []
        for k in sorted(hum):
            h, m = hum[k], mar.get(k)
            if m is None:
                cells.append(f"{k}: no Marlin counterpart")
            elif h.shape != m.shape:
                cells.append(f"{k}: shape {list(h.shape)} vs Marlin {list(m.shape)}")
            elif torch.equal(h.view(torch.uint8) if h.dtype != torch.int32 else h,
                             m.view(torch.uint8) if m.dtype != torch.int32 else m):
                cells.append(f"{k}: IDENTICAL")
            else:
                cells.append(f"{k}: differ")
        b13 = meta["sublayers"]["w13"]["layer_config"]["b_dtype"]
        b2 = meta["sublayers"]["w2"]["layer_config"]["b_dtype"]
        line = (f"{c['name']} ({c['dtype']}, I={c['I']}, g={c['group']}, b_dtype {b13}/{b2}): "
                + "; ".join(cells))
        print(line)
        rows.append(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

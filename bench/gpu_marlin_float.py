"""vLLM 0.33.0's shipped Marlin MoE kernel on moepack's float Marlin output (docs/marlin_float.md).

Loads the wheel's `_moe_C_stable_libtorch.abi3.so` (the library only: no vLLM Python) into the
device's torch and runs the fused MoE the way vLLM's Marlin experts do -- gemm1 over w13 with
`moe_wna16_marlin_gemm`, silu(gate) * up, gemm2 over w2 with the router weights, top-k sum --
on each converted layer, against an fp32 MoE computed from the *source* checkpoint's tensors
(decoded here from their definitions, not from the layout: FP8 block, channel and per-tensor,
MXFP8, NVFP4 and MXFP4; a per-tensor source's w13 requantised on the device as vLLM 0.33's
process_fp8_weight_tensor_strategy_moe does, the values vLLM serves). Every case must land at bf16/fp16
rounding (< 2e-2), at two batch sizes (moe block 8: the kernel's small-batch thread configs;
64: the large-batch ones), and each corruption of moepack's output that a layout bug would
produce must fail (> 0.2): gate/up halves swapped; the scales as the checkpoint orders them
(Marlin's permutation and, for E8M0 / NVFP4 scales, the pair swap undone); FP8's fused exponent
bias dropped; MX's pair swap dropped; FP8 block's K groups reversed; FP8 channel's scales not
permuted; NVFP4's global scale dropped. gpt-oss (marlin-mxfp4 from gpt-oss' MXFP4, the tiny published-format checkpoint of
tests/gpt_oss): the hidden states padded to the layer's Hp, w13's rows interleaved (gate
c1[:, 0::2], up c1[:, 1::2]), vLLM's swigluoai (gate clamped above at 7, up to [-7, 7],
(up + 1) * gate * sigmoid(1.702 gate)) and both biases through the kernel's b_bias, against the
fp32 gpt-oss MoE with the biases; corruptions: biases dropped, gate/up swapped (moepack's output
of the source with every gate/up row pair exchanged, out_gate_up_swapped/).

  python3 gpu_marlin_float.py --so MOE_C_SO ARTIFACT_ROOT [--json OUT.json]

ARTIFACT_ROOT/<case>/{src,out,case.json} come from `bench/gpu_marlin_float.sh prepare`.
Needs only torch (with float8 dtypes) and a CUDA device. Exit 0 when every check holds.
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "vllm"))
from gpu_marlin_kernel import align, read_safetensors  # noqa: E402

# vllm.scalar_type ids in vLLM 0.33.0 (scalar_types.<name>.id): the kernel's b_type_id.
FLOAT8_E4M3FN, FLOAT4_E2M1F = 2814749767172868, 562949953487106
RIGHT_TOL, WRONG_MIN = 2e-2, 0.2
# The tiny gpt-oss' biases are small beside its expert outputs: dropping them moves the MoE by
# 0.13-0.14 in a CPU dry run (a stand-in op decoding the layout, tests/vllm/layouts.py), where
# the right layout lands at 2e-3; 0.05 is 2.5x RIGHT_TOL.
WRONG_MIN_OF = {"biases_dropped": 0.05}
# ---- the source, decoded from its definition (fp32 [N, K]) ------------------------------------

def e4m3(u8: torch.Tensor) -> torch.Tensor:
    return u8.contiguous().view(torch.float8_e4m3fn).float()


def e8m0(u8: torch.Tensor) -> torch.Tensor:
    return torch.exp2(u8.float() - 127.0)


_E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def e2m1(packed: torch.Tensor) -> torch.Tensor:
    """[N, K/2] bytes, the even k in the low nibble -> fp32 [N, K]."""
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(packed.shape[0], -1)
    return _E2M1[codes.long()]


def gpt_oss_experts(src: dict, pre: str, E: int) -> list:
    """gpt-oss' fused MXFP4 experts -> per expert (gate, up, down, gate bias, up bias, down bias)."""
    def dense(proj, e):
        blocks = src[pre + proj + "_blocks"][e]
        n = blocks.shape[0]
        s = e8m0(src[pre + proj + "_scales"][e])
        return e2m1(blocks.reshape(n, -1)) * s.repeat_interleave(32, 1)
    out = []
    for e in range(E):
        gu, b = dense("gate_up_proj", e), src[pre + "gate_up_proj_bias"][e].float()
        out.append([gu[0::2], gu[1::2], dense("down_proj", e), b[0::2], b[1::2],
                    src[pre + "down_proj_bias"][e].float()])
    return out


def gpt_oss_act(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """vLLM's swigluoai (alpha 1.702, limit 7.0) on fp32 gate and up."""
    g = g.clamp(max=7.0)
    u = u.clamp(min=-7.0, max=7.0)
    return (u + 1) * g * torch.sigmoid(1.702 * g)


def source_linear(src: dict, prefix: str, fmt: str) -> torch.Tensor:
    if fmt == "modelopt-nvfp4":
        s = e4m3(src[prefix + "weight_scale"]) * src[prefix + "weight_scale_2"].float().reshape(())
        return e2m1(src[prefix + "weight"]) * s.repeat_interleave(16, 1)
    if fmt == "ct-nvfp4":
        s = e4m3(src[prefix + "weight_scale"]) / src[prefix + "weight_global_scale"].float().reshape(())
        return e2m1(src[prefix + "weight_packed"]) * s.repeat_interleave(16, 1)
    if fmt == "ct-mxfp4":
        s = e8m0(src[prefix + "weight_scale"])
        return e2m1(src[prefix + "weight_packed"]) * s.repeat_interleave(32, 1)
    w = src[prefix + "weight"]
    if fmt in ("fp8-block", "ct-fp8-block"):
        s = src[prefix + ("weight_scale_inv" if fmt == "fp8-block" else "weight_scale")].float()
        n, k = w.shape
        s = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
        return e4m3(w) * s
    if fmt in ("modelopt-mxfp8", "ct-mxfp8"):
        return e4m3(w) * e8m0(src[prefix + "weight_scale"]).repeat_interleave(32, 1)
    if fmt == "ct-fp8-channel":  # weight_scale [N, 1]
        return e4m3(w) * src[prefix + "weight_scale"].float().reshape(-1, 1)
    if fmt in ("ct-fp8-tensor", "modelopt-fp8"):  # weight_scale [1] / []
        return e4m3(w) * src[prefix + "weight_scale"].float().reshape(())
    raise ValueError(f"no source decoder for {fmt}")


PER_TENSOR = ("ct-fp8-tensor", "modelopt-fp8")


def vllm_per_tensor_gate_up(src: dict, pre: str) -> list:
    """Gate and up of a per-tensor FP8 source as vLLM 0.33 serves them, computed on the device as
    process_fp8_weight_tensor_strategy_moe computes them: m = max(gate scale, up scale); each
    shard's codes to fp16 times its scale (a 0-d CUDA tensor: rounded to fp16), then
    x * (1 / m) in fp32, clamped to +-448, to e4m3 (round to nearest even); served as e4m3 * m."""
    s = [src[f"{pre}{p}.weight_scale"].float().reshape(()).cuda() for p in ("gate_proj", "up_proj")]
    m = torch.maximum(s[0], s[1])
    out = []
    for p, sp in zip(("gate_proj", "up_proj"), s):
        q = src[f"{pre}{p}.weight"].cuda().view(torch.float8_e4m3fn)
        dq = q.to(torch.float16) * sp.to(torch.float16)
        x = (dq.float() * (1.0 / m)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        out.append(x.float() * m)
    return out


# ---- Marlin's scale permutations (docs/marlin.md "Scales"), for the corruptions ----------------

def perm_src(grouped: bool) -> torch.Tensor:
    """out[i] = in[src[i]] inside each chunk (64 grouped, 32 single)."""
    if grouped:
        i = torch.arange(64)
        return 8 * (i % 8) + i // 8
    i = torch.arange(32)
    return 2 * (i // 8) + 8 * ((i % 8) // 2) + (i % 2)


def unpermute(s: torch.Tensor, grouped: bool) -> torch.Tensor:
    """[E, G, N] as stored -> the logical [E, G, N] (each expert's [G, N] flattened)."""
    src = perm_src(grouped)
    c = src.numel()
    flat = s.reshape(s.shape[0], -1, c)
    out = torch.empty_like(flat)
    out[:, :, src] = flat
    return out.reshape(s.shape)


def pair_swap(s: torch.Tensor) -> torch.Tensor:
    flat = s.reshape(-1, 4)
    return flat[:, [0, 2, 1, 3]].reshape(s.shape).contiguous()


def swap_halves(t: torch.Tensor) -> torch.Tensor:
    # torch.cat has no CUDA kernel for float8_e8m0fnu: one-byte dtypes move as raw bytes.
    r = t.contiguous().view(torch.uint8) if t.element_size() == 1 else t
    half = r.shape[-1] // 2
    out = torch.cat([r[..., half:], r[..., :half]], -1).contiguous()
    return out.view(t.dtype) if t.element_size() == 1 else out


# ---- the fused MoE on the kernel --------------------------------------------------------------

def kernel_moe(x, p: dict, topk_ids, topk_w, block: int, H: int, ip: int):
    op = torch.ops._moe_C.moe_wna16_marlin_gemm
    M, topk, E = x.shape[0], topk_ids.shape[1], p["w13"].shape[0]
    gpt_oss = p.get("gpt_oss", False)
    # gpt-oss: the layer pads the hidden states to the parameters' Hp and cuts the output back.
    hp = p["w13"].shape[1] * 16 if gpt_oss else H
    if hp != H:
        x = F.pad(x, (0, hp - H))
    sorted_ids, expert_ids, ntok = align(topk_ids, block, E)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ws = torch.zeros(sms * 4, dtype=torch.int32, device="cuda")
    c1 = torch.empty(M * topk, 2 * ip, dtype=x.dtype, device="cuda")
    c1 = op(x, c1, p["w13"], p.get("b13"), p["s13"], None, p.get("g13"), None, ws, sorted_ids,
            expert_ids, ntok, topk_w, block, topk, False, p["type"], M, 2 * ip, hp, False, True,
            False, -1, -1, -1)
    if gpt_oss:
        act = gpt_oss_act(c1[:, 0::2].float(), c1[:, 1::2].float()).to(x.dtype)
    else:
        act = (F.silu(c1[:, :ip].float()) * c1[:, ip:].float()).to(x.dtype)
    ws.zero_()
    c2 = torch.empty(M * topk, hp, dtype=x.dtype, device="cuda")
    c2 = op(act, c2, p["w2"], p.get("b2"), p["s2"], None, p.get("g2"), None, ws, sorted_ids,
            expert_ids, ntok, topk_w, block, 1, True, p["type"], M * topk, hp, ip, False, True,
            False, -1, -1, -1)
    return c2.view(M, topk, hp)[..., :H].float().sum(1)


def layout_params(out: dict, P: str, layout: str, act: torch.dtype) -> dict:
    """The kernel's operands from moepack's parameters, on the device."""
    w = {k: out[P + k].cuda() for k in ("w13_weight", "w2_weight")}
    if layout == "marlin-fp8":
        name = "weight_scale_inv" if P + "w13_weight_scale_inv" in out else "weight_scale"
        s13, s2 = out[P + "w13_" + name], out[P + "w2_" + name]
        assert s13.dtype == act, (s13.dtype, act)
        return {"w13": w["w13_weight"], "w2": w["w2_weight"], "s13": s13.cuda(),
                "s2": s2.cuda(), "type": FLOAT8_E4M3FN, "kind": "fp8"}
    if layout == "marlin-mxfp8":
        conv = lambda t: t.contiguous().view(torch.float8_e8m0fnu).cuda()  # noqa: E731
        return {"w13": w["w13_weight"], "w2": w["w2_weight"],
                "s13": conv(out[P + "w13_weight_scale"]), "s2": conv(out[P + "w2_weight_scale"]),
                "type": FLOAT8_E4M3FN, "kind": "e8m0"}
    if layout in ("marlin-nvfp4", "marlin-mxfp4"):
        nv = layout == "marlin-nvfp4"
        conv = lambda t: t.contiguous().view(  # noqa: E731
            torch.float8_e4m3fn if nv else torch.float8_e8m0fnu).cuda()
        p = {"w13": w["w13_weight"], "w2": w["w2_weight"], "s13": conv(out[P + "w13_weight_scale"]),
             "s2": conv(out[P + "w2_weight_scale"]), "type": FLOAT4_E2M1F,
             "kind": "e4m3" if nv else "e8m0"}
        if nv:  # the processed decode global per expert, as vLLM's Marlin NVFP4 path holds it
            p["g13"] = out[P + "w13_weight_scale_2"].float().cuda()
            p["g2"] = out[P + "w2_weight_scale_2"].float().cuda()
        if P + "w13_bias" in out:  # gpt-oss: the permuted biases, bf16, as the kernel's b_bias
            p.update(gpt_oss=True, b13=out[P + "w13_bias"].cuda(), b2=out[P + "w2_bias"].cuda())
        return p
    raise ValueError(f"no kernel operands for {layout}")


def corruptions(p: dict, act: torch.dtype, swapped: dict | None = None) -> dict:
    """name -> corrupted operands. Scale tensors are bit-manipulated as raw bytes. gpt-oss:
    `swapped` holds the operands of moepack's output of the gate/up-exchanged source."""
    if p.get("gpt_oss"):
        return {"gate_up_swapped": swapped,
                "biases_dropped": dict(p, b13=torch.zeros_like(p["b13"]),
                                       b2=torch.zeros_like(p["b2"]))}
    out = {"gate_up_swapped": dict(p, w13=swap_halves(p["w13"]), s13=swap_halves(p["s13"]))}

    def raw(t):
        return t.contiguous().view(torch.uint8) if t.element_size() == 1 else t

    def back(t, like):
        return t.view(like.dtype) if like.element_size() == 1 else t

    s13 = p["s13"]
    G = s13.shape[1]
    if p["kind"] == "fp8":
        out["exponent_bias_dropped"] = dict(
            p, s13=(s13.float() * 2.0 ** (-120 if act == torch.bfloat16 else -8)).to(act))
        # A 128-column block holds one value, so the in-row permutation alone is invisible.
        if G > 1:
            out["k_groups_reversed"] = dict(p, s13=s13.flip(1).contiguous())
        elif p.get("per_channel"):  # one scale per column: the 32-entry permutation undone
            out["scales_not_permuted"] = dict(p, s13=unpermute(s13, False).contiguous())
    else:
        r = raw(s13)
        out["pair_swap_dropped"] = dict(p, s13=back(pair_swap(r), s13))
        out["scales_not_permuted"] = dict(p, s13=back(unpermute(pair_swap(r), G > 1), s13))
    if "g13" in p:
        out["global_scale_dropped"] = dict(p, g13=torch.ones_like(p["g13"]),
                                           g2=torch.ones_like(p["g2"]))
    return out


def check_case(root: Path, name: str) -> dict:
    case = root / name
    meta = json.loads((case / "case.json").read_text())
    man = json.loads((case / "out" / "moepack.json").read_text())
    out = read_safetensors(case / "out" / "model.safetensors")
    src = read_safetensors(case / "src" / "model.safetensors")
    L = man["layers"][0]
    E, H, I, P = L["experts"], L["hidden"], L["inter"], L["param_prefix"]
    ip = L.get("inter_padded", I)
    act = torch.bfloat16 if meta["act"] == "bf16" else torch.float16
    p = layout_params(out, P, meta["layout"], act)
    pre = L["module"] + ".experts."
    gpt_oss = meta["format"] == "gpt-oss"
    swapped = None
    if gpt_oss:
        W = [[t.cuda() for t in ex] for ex in gpt_oss_experts(src, pre, E)]
        swapped = layout_params(
            read_safetensors(case / "out_gate_up_swapped" / "model.safetensors"), P,
            meta["layout"], act)
    else:
        W = [[source_linear(src, f"{pre}{e}.{proj}.", meta["format"]).cuda()
              for proj in ("gate_proj", "up_proj", "down_proj")] + [None] * 3 for e in range(E)]
        if meta["format"] in PER_TENSOR:  # what vLLM serves: w13 requantised to one scale
            for e in range(E):
                W[e][0], W[e][1] = vllm_per_tensor_gate_up(src, f"{pre}{e}.")
    p["per_channel"] = meta["format"] == "ct-fp8-channel"
    rec = {"case": name, "format": meta["format"], "layout": meta["layout"], "E": E, "H": H,
           "I": I, "Ip": ip, "act": meta["act"], "runs": []}
    torch.manual_seed(0)
    # Pre-activations of a few units, so that silu is far from linear: with small ones
    # silu(g) * u is nearly symmetric in g and u, and a gate/up swap would hide.
    w_rms = float(torch.stack([W[e][0].float().pow(2).mean() for e in range(E)]).mean().sqrt())
    x_std = 3.0 / (w_rms * H ** 0.5 + 1e-30)
    for M, block in ((16, 8), (256, 64)):
        topk = 2
        x = (torch.randn(M, H) * x_std).to(act).cuda()
        topk_ids = torch.stack([torch.randperm(E)[:topk] for _ in range(M)]).to(torch.int32).cuda()
        topk_w = torch.softmax(torch.randn(M, topk), -1).float().cuda()
        xs = x.float()
        ref = torch.zeros(M, H, device="cuda")
        for j in range(topk):
            for e in range(E):
                rows = (topk_ids[:, j] == e).nonzero().flatten()
                if rows.numel() == 0:
                    continue
                h = xs[rows]
                if gpt_oss:
                    g, u = h @ W[e][0].T + W[e][3], h @ W[e][1].T + W[e][4]
                    y = gpt_oss_act(g, u) @ W[e][2].T + W[e][5]
                else:
                    y = (F.silu(h @ W[e][0].T) * (h @ W[e][1].T)) @ W[e][2].T
                ref[rows] += topk_w[rows, j:j + 1] * y
        t0 = time.time()
        y = kernel_moe(x, p, topk_ids, topk_w, block, H, ip)
        torch.cuda.synchronize()
        err = float((y - ref).norm() / ref.norm())
        run = {"M": M, "block": block, "err": err, "first_call_s": round(time.time() - t0, 2),
               "corruptions": {}}
        for cname, bad in corruptions(p, act, swapped).items():
            yb = kernel_moe(x, bad, topk_ids, topk_w, block, H, ip)
            run["corruptions"][cname] = float((yb - ref).norm() / ref.norm())
        rec["runs"].append(run)
    ok = all(r["err"] < RIGHT_TOL and
             all(v > WRONG_MIN_OF.get(k, WRONG_MIN) or v != v for k, v in r["corruptions"].items())
             for r in rec["runs"])
    rec["passed"] = ok
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--so", required=True)
    ap.add_argument("root")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.ops.load_library(args.so)
    schema = str(torch.ops._moe_C.moe_wna16_marlin_gemm.default._schema)
    print("schema:", schema)
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    root = Path(args.root)
    records, failed = [], 0
    for name in sorted(p.name for p in root.iterdir() if (p / "case.json").exists()):
        try:
            rec = check_case(root, name)
        except Exception as e:  # noqa: BLE001 - reported per case, the run goes on
            rec = {"case": name, "passed": False, "exception": f"{type(e).__name__}: {e}"}
        records.append(rec)
        failed += not rec["passed"]
        if "exception" in rec:
            print(f"{name:44s} EXCEPTION {rec['exception'][:300]}", flush=True)
            continue
        for r in rec["runs"]:
            bad = " ".join(f"{k}={v:.3g}" for k, v in r["corruptions"].items())
            print(f"{name:44s} M={r['M']:<4d} block={r['block']:<3d} err={r['err']:.3e} "
                  f"[{bad}] first={r['first_call_s']}s {'PASS' if rec['passed'] else 'FAIL'}",
                  flush=True)
    print(f"{len(records)} case(s), {failed} failing")
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

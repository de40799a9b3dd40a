#!/usr/bin/env python3
"""The Humming MoE layout of humming_spec.md section 4, written from the spec alone (closed form,
no humming code, no kernel emulation), checked against every 16-bit-activation fixture.

  python ref_layout.py FIXTURE_DIR        (torch + safetensors; exit 0 when all match)

This is the executable form of the spec that moepack's C++ codec should reproduce: codes ->
[recode] -> pad (N to 256, K to 128, end of the stacked tensor) -> [int2fp] -> Marlin 16x64 tile
packing -> scales/zero points/bias permuted per 64/32 columns.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


# ---------------- checkpoint tensors -> codes [E, N, K], scales [E, N, G], zp codes [E, N, G]

def unpack(w: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """int32 packed along `dim`, field i at bits [i*b, (i+1)*b) -> codes (int64)."""
    pf = 32 // bits
    w = w.transpose(dim, -1).to(torch.int64) & 0xFFFFFFFF
    parts = torch.stack([(w >> (bits * i)) & ((1 << bits) - 1) for i in range(pf)], -1)
    return parts.reshape(*w.shape[:-1], -1).transpose(dim, -1)


def unpack_awq(w: torch.Tensor) -> torch.Tensor:  # [.., C/8] AWQ order -> [.., C]
    w = w.to(torch.int64) & 0xFFFFFFFF
    f = torch.stack([(w >> (4 * s)) & 0xF for s in range(8)], -1)
    out = torch.empty_like(f)
    out[..., AWQ_ORDER] = f
    return out.reshape(*w.shape[:-1], -1)


def decode_inputs(c: dict, t: dict, sub: str):
    b = c["bits"]
    if c["fmt"] == "gptq":
        return (unpack(t[f"{sub}_qweight"], b, 1).transpose(1, 2),
                t[f"{sub}_scales"].transpose(1, 2), None)
    if c["fmt"] == "awq":
        return (unpack_awq(t[f"{sub}_qweight"]).transpose(1, 2),
                t[f"{sub}_scales"].transpose(1, 2),
                unpack_awq(t[f"{sub}_qzeros"]).transpose(1, 2))
    if c["fmt"] == "ct":
        zp = t.get(f"{sub}_weight_zero_point")
        return (unpack(t[f"{sub}_weight_packed"], b, 2), t[f"{sub}_weight_scale"],
                None if zp is None else unpack(zp, b, 1))
    if c["fmt"] == "moe_wna16":
        u = t[f"{sub}_qweight"].to(torch.int64)
        codes = torch.stack([u & 0xF, u >> 4], -1).reshape(u.shape[0], u.shape[1], -1)
        return codes, t[f"{sub}_scales"], None
    raise ValueError(c["fmt"])


# ---------------- the layout

def marlin_tile_positions(bits: int):
    """For one 16(k) x 64(n) tile stored as T = 16*64*bits/32 consecutive int32 words: word r,
    field f (bits [f*bits, (f+1)*bits)) holds the code at (k, n) = (dk[r, f], dn[r, f]).
    Thread t = r // (4 or 8) of a warp owns n = t//4 + 8*{0,1} (+16*j) and k = 2*(t%4) + {0,1,8,9}
    -- the mma.m16n8k16 B-fragment order; fields interleaved 0,2,4,6,1,3,5,7 (4-bit) / 0,2,1,3
    (8-bit) so one prmt/lop3 dequantises a pair."""
    pf = 32 // bits
    T = 1024 // pf
    dk = torch.zeros(T, pf, dtype=torch.long)
    dn = torch.zeros(T, pf, dtype=torch.long)
    for r in range(T):
        if bits == 4:
            t, j, hh = r // 4, r % 4, 0
        else:
            t, j, hh = (r // 2) // 4, (r // 2) % 4, r % 2
        kb, nb = 2 * (t % 4), 16 * j + t // 4
        for f in range(pf):
            if bits == 4:
                dk[r, f] = kb + (0, 8, 0, 8, 1, 9, 1, 9)[f]
                dn[r, f] = nb + (0, 0, 8, 8, 0, 0, 8, 8)[f]
            else:
                dk[r, f] = kb + (0, 8, 1, 9)[f]
                dn[r, f] = nb + 8 * hh
    return dk, dn


def to_i32(x):
    x = x & 0xFFFFFFFF
    return torch.where(x >= 1 << 31, x - (1 << 32), x).to(torch.int32)


def tile_encode(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes [E, N, K] (N, K multiples of 64 / 16) -> int32 [E, K/16, N*16*bits/32]."""
    E, N, K = codes.shape
    dk, dn = marlin_tile_positions(bits)
    T = dk.shape[0]
    kc = codes.transpose(1, 2)  # [E, K, N]
    kt = torch.arange(K // 16).view(-1, 1, 1)
    nt = torch.arange(N // 64).view(1, -1, 1)
    words = torch.zeros(E, K // 16, N // 64, T, dtype=torch.int64)
    for f in range(32 // bits):
        words |= kc[:, 16 * kt + dk[:, f].view(1, 1, -1), 64 * nt + dn[:, f].view(1, 1, -1)] \
            << (bits * f)
    return to_i32(words.reshape(E, K // 16, -1))


PERM64 = [i + 8 * j for i in range(8) for j in range(8)]  # stored[c] = logical[PERM64[c]]
PERM32 = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]


def perm_cols(x: torch.Tensor, perm) -> torch.Tensor:
    s = x.shape
    return x.reshape(-1, len(perm))[:, perm].reshape(s)


def ref_sublayer(c: dict, codes, scales, zp, bias, sub: str, dtype):
    b = c["bits"]
    E, N, K = codes.shape
    mid = 1 << (b - 1)
    # 4.3 recode: symmetric integer weights with no code 0 in the whole sublayer (all local
    # experts, before padding) become sign-magnitude float{b}e0m{b-1}
    recoded = (zp is None and c["fmt"] != "moe_wna16" and b in (4, 8)
               and bool((codes != 0).all()))
    if recoded:
        w = codes - mid
        codes = w.abs() | ((w < 0).to(torch.int64) << (b - 1))
    # 4.2 padding (zeros) at the END of N and K, after stacking gate|up
    Np, Kp = -(-N // 256) * 256, -(-K // 128) * 128
    g = c["group"]
    G, Gp = K // g, Kp // g
    codes = torch.nn.functional.pad(codes, (0, Kp - K, 0, Np - N))
    scales = torch.nn.functional.pad(scales, (0, Gp - G, 0, Np - N))
    if zp is not None:
        zp = torch.nn.functional.pad(zp, (0, Gp - G, 0, Np - N))
    # 4.4 int2fp preprocessing (integer weights only; after padding)
    if not recoded and dtype == torch.bfloat16 and (b > 7 or (zp is not None and b > 6)):
        z = (zp if zp is not None else torch.full_like(scales, mid, dtype=torch.int64))
        z = z.to(torch.int64).repeat_interleave(g, dim=2)
        codes = torch.where(codes >= z, codes - z, (1 << b) - 1 - codes)
    out = {"weight": tile_encode(codes, b),
           "weight_scale": perm_cols(scales.transpose(1, 2).contiguous(), PERM64)}
    if zp is not None:  # 4.6
        zpp = perm_cols(zp.transpose(1, 2).contiguous(), PERM64).to(torch.int64)  # [E, Gp, Np]
        zb = 4 if b <= 4 else 8
        per = 32 // zb
        zpp = zpp.reshape(E, Gp, Np // per, per)
        out["zero_point"] = to_i32((zpp << (torch.arange(per) * zb)).sum(-1))
    if bias is not None:
        out["bias"] = perm_cols(torch.nn.functional.pad(bias, (0, Np - N)), PERM32)
    return out


def main() -> int:
    fx = Path(sys.argv[1])
    ok = bad = 0
    for jp in sorted(fx.glob("*.json")):
        if jp.name == "index.json":
            continue
        meta = json.loads(jp.read_text())
        c = meta["case"]
        if meta["error"] or c["act"] or c["group"] == -1:
            continue
        st = load_file(str(fx / f"{c['name']}.safetensors"))
        t = {k[3:]: v for k, v in st.items() if k.startswith("in.")}
        hum = {k[4:]: v for k, v in st.items() if k.startswith("out.")}
        dtype = torch.bfloat16 if c["dtype"] == "bf16" else torch.float16
        mism = []
        for sub in ("w13", "w2"):
            codes, scales, zp = decode_inputs(c, t, sub)
            ref = ref_sublayer(c, codes.to(torch.int64), scales.to(dtype), zp,
                               t.get(f"{sub}_bias"), sub, dtype)
            for k, v in ref.items():
                h = hum.get(f"{sub}_{k}")
                if h is None or h.shape != v.shape or h.dtype != v.dtype or not torch.equal(h, v):
                    mism.append(f"{sub}_{k}")
            extra = {k for k in hum if k.startswith(sub + "_")} - {f"{sub}_{k}" for k in ref}
            mism += sorted(extra)
        print(f"{c['name']}: " + ("MATCH" if not mism else f"MISMATCH {mism}"))
        ok += not mism
        bad += bool(mism)
    print(f"{ok} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

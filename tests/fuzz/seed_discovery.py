#!/usr/bin/env python3
"""Seed inputs for fuzz_moe_discovery (tests/fuzz/moe_discovery_fuzz.cpp): small, valid GPTQ,
compressed-tensors and bf16 MoE layers written in the fuzzer's record format, so that mutations
start from checkpoints that discovery accepts and the codecs unpack.

    seed_discovery.py OUT_DIR
"""
import os
import sys

# Indices into kTokens of moe_discovery_fuzz.cpp.
TOK = {"0": 2, "1": 3, ".": 9, "gate_proj": 14, "up_proj": 15, "down_proj": 16, "w1": 17,
       "w2": 18, "w3": 19, "weight": 24, "qweight": 25, "qzeros": 26, "scales": 27, "g_idx": 28,
       "weight_packed": 29, "weight_scale": 30, "L0": 45}
DT = {"I32": 0, "F16": 1, "BF16": 2, "F32": 3}
FILL = {"zero": 0, "random": 1, "gidx32": 2, "ones": 3}


def record(tokens, dtype, shape, fill, shard=0):
    out = bytes(TOK[t] for t in tokens) + b"\xff"
    out += bytes([DT[dtype], len(shape)]) + bytes(shape) + bytes([FILL[fill], shard])
    return out


def header(method_row, experts, top_k, hidden, inter):
    return bytes([method_row, experts, top_k, hidden // 8, inter // 8])


def gptq(E=2, H=64, I=32, projs=("gate_proj", "up_proj", "down_proj")):
    b = header(1, E, 2, H, I)
    for e in range(E):
        for p in projs:
            n, k = (H, I) if p in ("down_proj", "w2") else (I, H)
            base = ["L0", str(e), ".", p, "."]
            b += record(base + ["qweight"], "I32", [k // 8, n], "random")
            b += record(base + ["scales"], "F16", [k // 32, n], "ones")
            b += record(base + ["qzeros"], "I32", [k // 32, n // 8], "random")
            b += record(base + ["g_idx"], "I32", [k], "gidx32")
    return b


def ct_pack(E=2, H=64, I=32):
    b = header(5, E, 1, H, I)
    for e in range(E):
        for p in ("gate_proj", "up_proj", "down_proj"):
            n, k = (H, I) if p == "down_proj" else (I, H)
            base = ["L0", str(e), ".", p, "."]
            b += record(base + ["weight_packed"], "I32", [n, k // 8], "random")
            b += record(base + ["weight_scale"], "F16", [n, k // 32], "ones")
    return b


def bf16(E=2, H=64, I=32):
    b = header(0, E, 1, H, I)
    for e in range(E):
        for p in ("w1", "w3", "w2"):
            n, k = (H, I) if p == "w2" else (I, H)
            b += record(["L0", str(e), ".", p, ".", "weight"], "BF16", [n, k], "ones")
    return b


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    seeds = {"gptq": gptq(), "gptq_mixtral": gptq(projs=("w1", "w3", "w2")), "ct_pack": ct_pack(),
             "bf16_mixtral": bf16()}
    for name, data in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()

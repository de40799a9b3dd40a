"""The Marlin MoE layout as the kernel reads it, and the source formats, decoded in torch alone
(from docs/marlin.md and the producers' formats; independent of moepack's C++). Shared by the CPU
forward test and the GPU kernel test (which runs where only torch is installed)."""

from __future__ import annotations

import torch

# ---- the Marlin layout as the kernel reads it (docs/marlin.md) ----

_tile_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def tile_coords(bits: int):
    """(dk, dn) [T, pf]: the k and n inside a 16x64 tile of field f of word r."""
    if bits not in _tile_cache:
        pf = 32 // bits
        T = 1024 // pf
        dk = torch.zeros(T, pf, dtype=torch.long)
        dn = torch.zeros(T, pf, dtype=torch.long)
        for r in range(T):
            if bits == 4:
                t, j, hh = r // 4, r % 4, 0
            else:
                t, j, hh = (r // 2) // 4, (r // 2) % 4, r % 2
            b, c = 2 * (t % 4), 16 * j + t // 4
            for f in range(pf):
                if bits == 4:
                    dk[r, f] = b + (0, 8, 0, 8, 1, 9, 1, 9)[f]
                    dn[r, f] = c + (0, 0, 8, 8, 0, 0, 8, 8)[f]
                else:
                    dk[r, f] = b + (0, 8, 1, 9)[f]
                    dn[r, f] = c + 8 * hh
        _tile_cache[bits] = (dk, dn)
    return _tile_cache[bits]


def marlin_codes(qw: torch.Tensor, bits: int, K: int, N: int) -> torch.Tensor:
    """One expert's int32 [K/16, N*16/pf] tiles -> codes [K, N]."""
    pf, T = 32 // bits, 1024 // (32 // bits)
    words = qw.to(torch.int64).view(K // 16, N // 64, T) & 0xFFFFFFFF
    dk, dn = tile_coords(bits)
    Q = torch.zeros(K, N, dtype=torch.int64)
    kt = torch.arange(K // 16).view(-1, 1, 1)
    nt = torch.arange(N // 64).view(1, -1, 1)
    for f in range(pf):
        vals = (words >> (bits * f)) & ((1 << bits) - 1)
        Q[16 * kt + dk[:, f].view(1, 1, -1), 64 * nt + dn[:, f].view(1, 1, -1)] = vals
    return Q


def unpermute_scales(s: torch.Tensor) -> torch.Tensor:
    """One expert's [G, N] scales as stored -> [G, N] in logical order (kernel rule: grouped
    8x8 transpose when G > 1, else the single 32-permutation)."""
    G, N = s.shape
    flat = s.reshape(-1)
    if G > 1:
        return flat.view(-1, 8, 8).transpose(1, 2).reshape(G, N)
    S = (0, 1, 8, 9, 16, 17, 24, 25)
    out = torch.empty_like(flat)
    chunks = flat.view(-1, 32)
    o = out.view(-1, 32)
    for i in range(4):
        for m in range(8):
            o[:, 2 * i + S[m]] = chunks[:, 8 * i + m]
    return out.view(G, N)


def marlin_zeros(z: torch.Tensor, N: int) -> torch.Tensor:
    """AWQ int4 zeros int32 [G, N/8] -> [G, N]: word c field p holds n = 64(c/8) + c%8 + 8P[p]."""
    P = (0, 2, 4, 6, 1, 3, 5, 7)
    G = z.shape[0]
    w = z.to(torch.int64) & 0xFFFFFFFF
    out = torch.zeros(G, N, dtype=torch.int64)
    c = torch.arange(N // 8)
    for p in range(8):
        out[:, 64 * (c // 8) + c % 8 + 8 * P[p]] = (w >> (4 * p)) & 0xF
    return out


def marlin_weight(qw, scales, zeros, bits, K, N) -> torch.Tensor:
    """W [K, N] in fp32 as the kernel computes it."""
    Q = marlin_codes(qw, bits, K, N)
    s = unpermute_scales(scales.float())
    G = s.shape[0]
    g = torch.arange(K) // (K // G)
    z = marlin_zeros(zeros, N)[g] if zeros is not None else (1 << (bits - 1))
    return (Q - z).float() * s[g]


# ---- the source checkpoint, decoded (fp32 reference) ----

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_rows(w: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, C] packed along R (low bits first) -> [R*pf, C]."""
    pf = 32 // bits
    w = w.to(torch.int64) & 0xFFFFFFFF
    parts = [(w >> (bits * i)) & ((1 << bits) - 1) for i in range(pf)]
    return torch.stack(parts, 1).reshape(w.shape[0] * pf, w.shape[1])


def source_linear(t: dict, name: str, fmt: str, bits: int) -> torch.Tensor:
    """Dequantised W [K, N] (y = x W) of one source Linear."""
    if fmt == "gptq":
        Q = unpack_rows(t[name + ".qweight"], bits)
        s = t[name + ".scales"].float()
        g = torch.arange(Q.shape[0]) // (Q.shape[0] // s.shape[0])
        return (Q - (1 << (bits - 1))).float() * s[g]
    if fmt == "awq":
        qw, qz = t[name + ".qweight"], t[name + ".qzeros"]

        def cols(w):
            w = w.to(torch.int64) & 0xFFFFFFFF
            out = torch.zeros(w.shape[0], w.shape[1] * 8, dtype=torch.int64)
            for p in range(8):
                out[:, AWQ_ORDER[p]::8] = (w >> (4 * p)) & 0xF
            return out

        Q, Z = cols(qw), cols(qz)
        s = t[name + ".scales"].float()
        g = torch.arange(Q.shape[0]) // (Q.shape[0] // s.shape[0])
        return (Q - Z[g]).float() * s[g]
    # compressed-tensors pack-quantized: weight_packed [N, K/pf], weight_scale [N, G]
    Q = unpack_rows(t[name + ".weight_packed"].t().contiguous(), bits).t()  # [N, K]
    s = t[name + ".weight_scale"].float()
    g = torch.arange(Q.shape[1]) // (Q.shape[1] // s.shape[1])
    return ((Q - (1 << (bits - 1))).float() * s[:, g]).t()




# ---- vLLM 0.33's float Marlin layouts as the kernel reads them (docs/marlin_float.md) ----

def pair_unswap(s: torch.Tensor) -> torch.Tensor:
    """Undoes the float scales' pair swap (every 4 stored values are (0, 2, 1, 3)); an
    involution, so it also applies it."""
    G, N = s.shape
    return s.reshape(-1, 4)[:, [0, 2, 1, 3]].reshape(G, N)


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def marlin_float_weight(qw, scales, bits, K, N, act_dtype, global_scale=None) -> torch.Tensor:
    """W [K, N] in fp32 as vLLM's Marlin kernel computes it for float codes: the int tile map
    on the raw e4m3 bytes (bits 8) or e2m1 nibbles (bits 4); FP8 scales in the activation dtype
    carrying the fused exponent bias 2^120 (bf16) / 2^8 (fp16); E8M0 scales pair-swapped after
    the permutation; NVFP4's "S0E5M3" bytes (float8_e4m3fn dtype) pair-swapped, each the fp16
    whose bits are byte << 7, times the expert's processed global scale and 2^-126 (bf16) /
    2^-14 (fp16)."""
    Q = marlin_codes(qw, bits, K, N)
    vals = E2M1[Q] if bits == 4 else Q.to(torch.uint8).view(torch.float8_e4m3fn).float()
    if scales.dtype == torch.float8_e8m0fnu:
        codes = pair_unswap(scales.view(torch.uint8))
        s = torch.exp2(unpermute_scales(codes.float()) - 127.0)
    elif scales.dtype == torch.float8_e4m3fn:
        b = pair_unswap(scales.view(torch.uint8)).to(torch.int32)
        f16 = (b << 7).to(torch.int16).view(torch.float16).float()
        bias = 2.0 ** (126 if act_dtype == torch.bfloat16 else 14)
        s = unpermute_scales(f16) * float(global_scale) / bias
    else:
        bias = 2.0 ** (120 if act_dtype == torch.bfloat16 else 8)
        s = unpermute_scales(scales.float()) / bias
    G = s.shape[0]
    g = torch.arange(K) // (K // G)
    return vals * s[g]


def marlin_bias(b: torch.Tensor) -> torch.Tensor:
    """One expert's [N] Marlin bias as stored (marlin_permute_bias: the single 32-permutation of
    the scales) -> fp32 [N] in logical column order."""
    return unpermute_scales(b.float().reshape(1, -1)).reshape(-1)


def gpt_oss_experts(t: dict, prefix: str, e: int) -> dict:
    """Expert e of a gpt-oss MXFP4 layer (`prefix` = "...mlp.experts."), decoded in fp32 from
    the published format (docs/gpt-oss.md "Tensors"): gate, up [K=H, I] and down [K=I, H] from
    the rows of `_blocks` (two e2m1 codes a byte, low nibble first) times 2^(scale - 127) per 32,
    w13's rows de-interleaved (row 2j gate j, 2j + 1 up j), and the three biases."""
    def dense(proj):
        blocks = t[prefix + proj + "_blocks"][e].to(torch.long)
        n = blocks.shape[0]
        codes = torch.stack([blocks & 15, blocks >> 4], -1).reshape(n, -1)
        s = torch.exp2(t[prefix + proj + "_scales"][e].float() - 127.0)
        return E2M1[codes] * s.repeat_interleave(32, 1)  # [N, K]
    gu, b = dense("gate_up_proj"), t[prefix + "gate_up_proj_bias"][e].float()
    return {"gate": gu[0::2].t(), "up": gu[1::2].t(), "down": dense("down_proj").t(),
            "gate_bias": b[0::2], "up_bias": b[1::2],
            "down_bias": t[prefix + "down_proj_bias"][e].float()}


def source_fp4_linear(t: dict, name: str, fmt: str) -> torch.Tensor:
    """Dequantised W [K, N] of one FP4 source Linear (two e2m1 codes a byte, low nibble = even
    k): ModelOpt NVFP4 e2m1 * (s * weight_scale_2), compressed-tensors NVFP4 e2m1 * (s /
    weight_global_scale), compressed-tensors MXFP4 e2m1 * 2^(c - 127)."""
    packed = t[name + (".weight" if fmt == "modelopt-nvfp4" else ".weight_packed")]
    b = packed.view(torch.uint8).to(torch.long)
    codes = torch.stack([b & 15, b >> 4], -1).reshape(b.shape[0], -1)
    w = E2M1[codes]
    if fmt == "ct-mxfp4":
        s = torch.exp2(t[name + ".weight_scale"].view(torch.uint8).float() - 127.0)
        return (w * s.repeat_interleave(32, 1)).t()
    s = t[name + ".weight_scale"].float()
    if fmt == "modelopt-nvfp4":
        s = s * t[name + ".weight_scale_2"].float().reshape(())
    else:
        s = s / t[name + ".weight_global_scale"].float().reshape(())
    return (w * s.repeat_interleave(16, 1)).t()


def source_float_linear(t: dict, name: str, fmt: str) -> torch.Tensor:
    """Dequantised W [K, N] of one float source Linear (weight e4m3 [N, K], or FP4)."""
    if fmt in ("modelopt-nvfp4", "ct-nvfp4", "ct-mxfp4"):
        return source_fp4_linear(t, name, fmt)
    w = t[name + ".weight"].view(torch.float8_e4m3fn).float()
    n, k = w.shape
    if fmt in ("fp8-block", "ct-fp8-block"):
        s = t[name + (".weight_scale_inv" if fmt == "fp8-block" else ".weight_scale")].float()
        s = s.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    elif fmt == "ct-fp8-channel":
        s = t[name + ".weight_scale"].float().reshape(n, 1)
    elif fmt in ("ct-fp8-tensor", "modelopt-fp8"):
        s = t[name + ".weight_scale"].float().reshape(1, 1)
    elif fmt in ("modelopt-mxfp8", "ct-mxfp8"):
        s = torch.exp2(t[name + ".weight_scale"].view(torch.uint8).float() - 127.0)
        s = s.repeat_interleave(32, 1)
    else:
        raise ValueError(f"no float source decoder for {fmt}")
    return (w * s).t()


def vllm_per_tensor_gate_up(t: dict, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Gate and up W [K, N] of one expert of a per-tensor FP8 source as vLLM 0.33 serves them:
    process_fp8_weight_tensor_strategy_moe (fp8_utils.py) keeps one w13 scale, m = the larger of
    the two, and requantises each shard: per_tensor_dequantize (codes and scale in fp16, the
    product in fp16) then static_scaled_fp8_quant (x * (1 / m) in fp32, clamped to +-448, e4m3
    round-to-nearest-even). From vLLM's functions and the H100 fixtures, not moepack's C++."""
    s = [t[f"{prefix}{p}.weight_scale"].float().reshape(()) for p in ("gate_proj", "up_proj")]
    m = torch.maximum(s[0], s[1])
    out = []
    for p, sp in zip(("gate_proj", "up_proj"), s):
        q = t[f"{prefix}{p}.weight"].view(torch.float8_e4m3fn)
        dq = q.to(torch.float16) * sp.to(torch.float16)
        x = (dq.float() * (1.0 / m)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        out.append((x.float() * m).t())
    return out[0], out[1]


# ---- gpt-oss MXFP4 for the OAI Triton kernels and FlashInfer TRT-LLM (docs/triton_mxfp4.md,
# docs/trtllm_fp4.md): the weights as each kernel reads them ----

def triton_mxfp4_dense(w, precision) -> torch.Tensor:
    """W [E, K, N] in fp32 from a triton_kernels FP4 Tensor (logical [E, K, N]) and its
    PrecisionConfig, read through the objects' own layouts: `unswizzle_data` of the value
    storage gives the [E, K/2, N] bytes (two e2m1 codes a byte along K, low nibble the even k),
    that of the scale storage the E8M0 codes [E, >= K/32, >= N], 2^(c - 127) per 32 along K."""
    E, K, N = (int(s) for s in w.shape)
    st = w.storage
    b = st.layout.unswizzle_data(st.data)
    assert list(b.shape) == [E, K // 2, N], (list(b.shape), [E, K // 2, N])
    b = b.to(torch.long)
    codes = torch.stack([b & 15, b >> 4], 2).reshape(E, K, N)
    s = precision.weight_scale.storage
    c = s.layout.unswizzle_data(s.data)[:, : K // 32, :N]
    return E2M1[codes] * torch.exp2(c.float() - 127.0).repeat_interleave(32, 1)


def shuffle_a_rows(m: int, block: int = 32) -> torch.Tensor:
    """FlashInfer shuffle_matrix_a's row map for epilogue tile 128 on FP4 (docs/trtllm_fp4.md
    "Row maps"): stored row r holds pre-shuffle row (r - w) + (w mod 8) * 4 + w // 8, w = r mod
    32."""
    r = torch.arange(m)
    w = r % block
    return (r - w) + (w % 8) * 4 + w // 8


def scale_128x4_index(rows: int, cols: int) -> torch.Tensor:
    """Where the 128x4-interleaved block scales keep (row, col) of a [rows, cols] matrix (rows a
    multiple of 128, cols of 4; TRT-LLM's SWIZZLED_128x4 computeSFIndex): tile (row // 128,
    col // 4) of 512 bytes, row-major over the tiles; inside, (row % 32) * 16 +
    (row % 128 // 32) * 4 + col % 4."""
    r = torch.arange(rows).unsqueeze(1)
    c = torch.arange(cols).unsqueeze(0)
    return ((r // 128) * (cols // 4) + c // 4) * 512 + (r % 32) * 16 + (r % 128 // 32) * 4 + c % 4


def trtllm_mxfp4_dense(w: torch.Tensor, sf: torch.Tensor, k: int) -> torch.Tensor:
    """W [E, M, K] in fp32, rows in pre-shuffle order, from FlashInfer's shuffled MXFP4 weights
    [E, M, K/2] and their E8M0 block scales (float8_e4m3fn view of [E, M, K/32], 128x4
    interleaved after the same row shuffle)."""
    E, M = w.shape[0], w.shape[1]
    src = shuffle_a_rows(M)
    b = torch.empty_like(w)
    b[:, src] = w  # stored row r holds pre-shuffle row src[r]
    b = b.to(torch.long)
    codes = torch.stack([b & 15, b >> 4], -1).reshape(E, M, k)
    flat = sf.view(torch.uint8).reshape(E, -1)
    c = flat[:, scale_128x4_index(M, k // 32).reshape(-1)].reshape(E, M, k // 32)
    unshuffled = torch.empty_like(c)
    unshuffled[:, src] = c
    return E2M1[codes] * torch.exp2(unshuffled.float() - 127.0).repeat_interleave(32, -1)


def trtllm_bias(b: torch.Tensor) -> torch.Tensor:
    """[E, M] float32 biases in pre-shuffle row order (the same row map as the weights)."""
    out = torch.empty_like(b)
    out[:, shuffle_a_rows(b.shape[1])] = b
    return out

"""CPU emulation of the three CUDA kernels humming-kernels 0.1.19 uses to post-process weights.

Written for moepack's Humming spec (issue 23) from the kernels' source as shipped in the wheel
(include/humming/kernel/pack_weight.cuh: pack_weight_kernel / unpack_weight_kernel;
include/humming/kernel/process.cuh: weight_repack_nk + humming_pack_weight). It is our own
index arithmetic, not humming code, and it only exists so that

  * make_fixtures.py can drive vLLM 0.33's / humming's *own* Python transform functions on a
    machine with no GPU (every tensor op they do runs in torch on the CPU; only these three ops
    need CUDA), and
  * the device run can prove the spec: the emulated bytes must equal the real kernels' bytes.

Fixtures made with the emulation are marked "ops": "cpu-emulation" in their JSON; ground truth
is the device run ("ops": "cuda").

install(sm_version=90) patches, for the life of the process:
  humming.ops.{pack_weight, unpack_weight, repack_weight}   -> the functions below
  humming.device.DeviceInfo                                 -> a fake H100 (sm_version 90)
  torch.Tensor.cuda                                         -> identity (AWQ's schema calls .cuda())
  torch.cuda.device (CPU-only torch)                        -> a no-op context manager
"""

from __future__ import annotations

import functools

import torch

__all__ = ["install", "pack_weight", "unpack_weight", "repack_weight"]

_U32 = 1 << 32


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 holding 0..2^32-1 -> int32 with the same bits."""
    x = x & 0xFFFFFFFF
    return torch.where(x >= (1 << 31), x - _U32, x).to(torch.int32)


def unpack_weight(inputs: torch.Tensor, num_bits: int, outputs=None) -> torch.Tensor:
    """pack_weight.cuh unpack_weight_kernel: the flat int32 stream is a little-endian bit stream;
    value i occupies bits [i*num_bits, (i+1)*num_bits). Shape [..., W] -> [..., W*32/num_bits]."""
    assert inputs.dtype == torch.int32 and inputs.size(-1) % num_bits == 0
    shape = inputs.shape[:-1] + (inputs.size(-1) // num_bits * 32,)
    words = inputs.reshape(-1).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(32, dtype=torch.int64)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # [W, 32] LSB first
    bits = bits.reshape(-1, num_bits)  # one row per value
    weights = (1 << torch.arange(num_bits, dtype=torch.int64))
    vals = (bits * weights).sum(-1)
    out = vals.to(torch.int32).reshape(shape)
    if outputs is not None:
        outputs.copy_(out)
        return outputs
    return out


def pack_weight(inputs: torch.Tensor, num_bits: int, outputs=None) -> torch.Tensor:
    """pack_weight.cuh pack_weight_kernel: inverse of unpack_weight (values masked to num_bits)."""
    assert inputs.dtype == torch.int32 and inputs.size(-1) % 32 == 0
    shape = inputs.shape[:-1] + (inputs.size(-1) * num_bits // 32,)
    vals = inputs.reshape(-1).to(torch.int64) & ((1 << num_bits) - 1)
    shifts = torch.arange(num_bits, dtype=torch.int64)
    bits = ((vals.unsqueeze(-1) >> shifts) & 1).reshape(-1, 32)
    words = (bits << torch.arange(32, dtype=torch.int64)).sum(-1)
    out = _to_int32(words).reshape(shape)
    if outputs is not None:
        outputs.copy_(out)
        return outputs
    return out


def _next_pow2(x: int) -> int:
    p = 1
    while p < x:
        p *= 2
    return p


@functools.lru_cache(maxsize=None)
def _tile_plan(B: int, A: int, transpose_mini: bool, interleave_mode: int, native: bool,
               packed_k: bool):
    """For one 64(n) x 64(k) tile: for every output word of the tile (in the order the kernel
    writes it within the tile's output rectangle) the (n, k) of each of its fields, split into the
    low B-1 bits' source and the top bit's source (they differ only for interleave modes 1, 2).

    Returns (dest_r, dest_c, low_n, low_k, high_n, high_k, slot_bits): dest_* are [Wt] positions
    inside the tile's output rectangle; *_n/*_k are [Wt, S] (S = 32 / next_pow2(B) fields)."""
    assert A in (8, 16) and B in (2, 4, 8)
    PB = _next_pow2(B)
    S = 32 // PB
    dims = (A // 4, 16 // A, A // 4, 2, 2, 32 // A)
    n_tmp = 1
    for d in dims:
        n_tmp *= d
    assert n_tmp == 128
    # tmp[f] <- smem[row][index] for each thread (weight_repack_nk, the loop over i, j, k)
    tmap = [[None] * 128 for _ in range(32)]
    for tid in range(32):
        for i in range(8):
            row = i * 8 + tid // 4
            for j in range(A // 2):
                for k in range(32 // A):
                    index = j * (128 // A) + (tid % 4) * (32 // A) + k
                    i1, i2, i3 = j // 2, (i * 8) // (A * 4), ((i * 8) % (A * 4)) // 16
                    i4, i5, i6 = i % 2, j % 2, k
                    idx = (i1, i2, i3, i5, i4, i6) if transpose_mini else (i1, i2, i3, i4, i5, i6)
                    f = 0
                    for d, v in zip(dims, idx):
                        f = f * d + v
                    assert tmap[tid][f] is None
                    tmap[tid][f] = (row, index)

    # humming_pack_weight: out_arr[i*PB + jw] field kk <- tmp[i*32 + jw*S + (kk | new_k)]
    def new_k(kk):
        stride = 32 // A
        group = S // stride
        return (kk % group) * stride + kk // group

    num_rows = A // 4
    ints_per_row = 16 * B // A
    dest_r, dest_c, ln, lk, hn, hk = [], [], [], [], [], []
    for tid in range(32):
        for r in range(num_rows):
            for jj in range(ints_per_row // B):
                for kb in range(B):
                    o = r * ints_per_row + jj * B + kb  # index into out_arr
                    i_o, jw = divmod(o, PB)
                    base = i_o * 32 + jw * S
                    lows, highs = [], []
                    for kk in range(S):
                        if native:
                            lo = hi = base + kk
                        else:
                            lo = base + (kk if interleave_mode % 2 == 0 else new_k(kk))
                            hi = base + (kk if interleave_mode // 2 == 0 else new_k(kk))
                        lows.append(tmap[tid][lo])
                        highs.append(tmap[tid][hi])
                    if packed_k:
                        hb = B // 2
                        region = jj * 2 + kb // hb
                        dest_r.append(0)
                        dest_c.append(region * 32 * B + tid * B + r * hb + kb % hb)
                    else:
                        dest_r.append(r)
                        dest_c.append(jj * 32 * B + tid * B + kb)
                    ln.append([p[0] for p in lows])
                    lk.append([p[1] for p in lows])
                    hn.append([p[0] for p in highs])
                    hk.append([p[1] for p in highs])
    t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return t(dest_r), t(dest_c), t(ln), t(lk), t(hn), t(hk), PB


def repack_weight(inputs, weight_bits, activation_bits, is_weight_packed,
                  should_preprocess_for_int2fp=False, should_preprocess_with_zp=False,
                  use_fused_e8m0_scale=False, interleave_mode=3, group_size_zp=0,
                  padded_shape_n=None, padded_shape_k=None, zero_point=None,
                  use_packed_k_layout=False, use_native_dequant=False, outputs=None):
    """process.cuh weight_repack_nk, same arguments and output shape as humming.ops.repack_weight.

    inputs: int32 [E?, N, K*B/32] (packed along K, N-first) or codes [E?, N, K]."""
    B, A = weight_bits, activation_bits
    assert inputs.dtype == torch.int32 and inputs.ndim in (2, 3)
    moe = inputs.ndim == 3
    x = inputs if moe else inputs.unsqueeze(0)
    E, N = x.size(0), x.size(1)
    codes = unpack_weight(x.contiguous(), B) if is_weight_packed else x
    K = codes.size(-1)
    assert padded_shape_n in (None, N) and padded_shape_k in (None, K), "vLLM never passes these"
    assert N % 64 == 0 and K % 64 == 0 and K % (512 // A) == 0
    if should_preprocess_with_zp:
        assert should_preprocess_for_int2fp
    mask = (1 << B) - 1
    X = codes.to(torch.int64) & mask
    if should_preprocess_for_int2fp:
        if should_preprocess_with_zp:
            gzp = K if group_size_zp == 0 else group_size_zp
            zp = zero_point if zero_point.ndim == 3 else zero_point.unsqueeze(0)
            G = zp.size(-1)
            assert zp.shape == (E, N * B // 32, G), zp.shape
            # packed along N: code of row n sits at bit (n*B)%32 of word (n*B)//32
            zpc = unpack_weight(zp.transpose(1, 2).contiguous(), B).transpose(1, 2)  # [E, N, G]
            zpv = zpc.to(torch.int64).repeat_interleave(gzp, dim=2)[:, :, :K]
        else:
            zpv = torch.full_like(X, 1 << (B - 1))
        X = torch.where(X >= zpv, X - zpv, mask - X)
    transpose_mini = use_packed_k_layout and not use_fused_e8m0_scale
    dr, dc, ln, lk, hn, hk, PB = _tile_plan(B, A, transpose_mini, interleave_mode,
                                             use_native_dequant, use_packed_k_layout)
    S = 32 // PB
    T = X.view(E, N // 64, 64, K // 64, 64).permute(0, 1, 3, 2, 4)  # [E, bx, by, n, k]
    m2 = (1 << (B - 1)) - 1
    m1 = 1 << (B - 1)
    if use_native_dequant:
        low = T[..., ln, lk] & mask
        word_fields = low
    else:
        word_fields = (T[..., ln, lk] & m2) | (T[..., hn, hk] & m1)  # [E, bx, by, Wt, S]
    shifts = torch.arange(S, dtype=torch.int64) * PB
    words = (word_fields << shifts).sum(-1)  # [E, bx, by, Wt]
    words = _to_int32(words)
    if B not in (2, 4, 8):
        raise NotImplementedError("odd-width compaction (3/5/6/7 bits) is not emulated")
    if use_packed_k_layout:
        assert A == 8 and B % 2 == 0
        cols = 128 * B  # per 64-n tile
        out = torch.empty(E, K // 64, N // 64, cols, dtype=torch.int32)
        o = out.permute(0, 2, 1, 3)  # [E, bx, by, cols]
        o[..., dc] = words
        return out.reshape(E, K // 64, N * 64 * B // 32) if moe else \
            out.reshape(K // 64, N * 64 * B // 32)
    rows = A // 4
    cols = 512 * B // A
    out = torch.empty(E, K // 64, rows, N // 64, cols, dtype=torch.int32)
    o = out.permute(0, 3, 1, 2, 4)  # [E, bx, by, r, c]
    o[..., dr, dc] = words
    pk = 256 // A
    res = out.reshape(E, K // pk, N * pk * B // 32)
    if outputs is not None:
        outputs.copy_(res if moe else res[0])
        return outputs
    return res if moe else res[0]


class _FakeDeviceValue:
    """What humming's _DeviceInfo extension reports for an H100 SXM (only sm_version and is_ppu
    matter to the weight transform; the rest is informational)."""

    def __init__(self, sm_version: int):
        self.index = 0
        self.name = "NVIDIA H100 80GB HBM3 (cpu emulation)"
        self.is_ppu = False
        self.sm_count = 132
        self.sm_major, self.sm_minor = divmod(sm_version, 10)
        self.sm_version = sm_version
        self.max_threads_per_block = 1024
        self.max_threads_per_sm = 2048
        self.max_registers_per_sm = 65536
        self.l2_cache_size = 50 * 1024 * 1024
        self.max_smem_size = 232448
        self.default_smem_size = 49152


def install(sm_version: int = 90) -> None:
    import humming.device as hdev
    import humming.ops as hops

    fake = _FakeDeviceValue(sm_version)

    def _new(cls, index=None):
        inst = object.__new__(cls)
        object.__setattr__(inst, "_index", 0)
        object.__setattr__(inst, "_value", fake)
        return inst

    hdev.DeviceInfo.__new__ = _new
    hdev.DeviceInfo._get_value = lambda self: fake
    hops.pack_weight = pack_weight
    hops.unpack_weight = unpack_weight
    hops.repack_weight = repack_weight
    torch.Tensor.cuda = lambda self, *a, **k: self
    if not torch.cuda.is_available():  # `with torch.cuda.device(None)` raises on CPU-only torch
        torch.cuda.device = _NullDevice


class _NullDevice:
    def __init__(self, device=None):
        self.device = device

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

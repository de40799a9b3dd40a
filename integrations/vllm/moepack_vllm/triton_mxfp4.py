"""A `triton-mxfp4` layer's parameters as the objects vLLM 0.33's OAI Triton MoE kernels read.

What vLLM 0.33.0's GptOssMxfp4MoEMethod leaves after its TRITON post-processing on an sm90 GPU
(`convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`, `_swizzle_mxfp4`; docs/triton_mxfp4.md):
each projection's weight as a triton_kernels `Tensor` of FP4 values whose storage is the
HopperMXValueLayout swizzle, its E8M0 scales as a `Tensor` in HopperMXScaleLayout (8 warps)
inside a `PrecisionConfig`, and the biases as float32 parameters. moepack wrote those swizzled
bytes ahead of time, each as the contiguous buffer whose transpose (`.mT`) is the storage, so
serving them is wrapping, not converting: no byte is moved or copied here.

Imports only torch and triton_kernels (vLLM's vendored copy, API generation 3.5.1), never vLLM:
the same function runs in the plugin and on a GPU host without vLLM (bench/gpu_triton_mxfp4.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The triton_kernels API generation vLLM 0.33.0 vendors (vllm/third_party/triton_kernels), the
# one whose Hopper layouts moepack's triton-mxfp4 bytes were checked against.
TRITON_KERNELS_API = "3.5.1"
# The warp count vLLM's _swizzle_mxfp4 gives HopperMXScaleLayout (its num_warps default).
NUM_WARPS = 8
MX_BLOCK = 32


class TritonMxfp4Error(ValueError):
    """A parameter that is not what a triton-mxfp4 layer holds (names the parameter)."""


@dataclass
class TritonMxfp4Weights:
    """What vLLM's TRITON branch hands the kernel: `w13` / `w2` (triton_kernels Tensors, logical
    shapes [E, H, 2Ip] / [E, Ip, H] of FP4 values) and their PrecisionConfigs (the swizzled
    scales, logical [E, gp, N])."""

    w13: object
    w2: object
    w13_precision: object
    w2_precision: object


def triton_kernels_api() -> str:
    """The API generation of the importable triton_kernels, told apart as vLLM 0.33 does
    (get_triton_kernels_version): 3.8 has no matmul_ogs, 3.5.1 no SparseMatrix."""
    try:
        import triton_kernels.matmul_ogs  # noqa: F401
    except ImportError:
        return "3.8"
    try:
        from triton_kernels.tensor import SparseMatrix  # noqa: F401
    except ImportError:
        return "3.5.1"
    return "3.6"


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _expect(name: str, t: torch.Tensor, dtype: torch.dtype, shape: list[int]) -> None:
    if not isinstance(t, torch.Tensor):
        raise TritonMxfp4Error(f"{name}: expected a torch tensor, got {type(t).__name__}")
    if t.dtype != dtype or list(t.shape) != shape:
        raise TritonMxfp4Error(f"{name}: {t.dtype} {list(t.shape)}, a triton-mxfp4 layer holds "
                               f"{dtype} {shape} here")
    if not t.is_contiguous():
        raise TritonMxfp4Error(f"{name}: not contiguous (its transpose is the kernel's storage)")


def _wrap_projection(name: str, weight: torch.Tensor, scale: torch.Tensor, k: int, n: int):
    """One projection (GEMM [K] -> [N]) as vLLM's _swizzle_mxfp4 leaves it: the weight Tensor and
    the scale Tensor, their storages the transposes of moepack's buffers."""
    from triton_kernels.tensor import FP4, Storage, Tensor
    from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout

    experts = weight.shape[0] if weight.dim() == 3 else -1
    if k % MX_BLOCK or n % 4:
        raise TritonMxfp4Error(f"{name}: K={k}, N={n}: K must be a multiple of 32 and N of 4")
    # Value swizzle (mma v3): [K/2, N] bytes -> [N16/4, 4 * K/2 padded to 32].
    _expect(name + " weight", weight, torch.uint8,
            [experts, _round_up(n, 16) // 4, 4 * _round_up(k // 2, 32)])
    groups = _round_up(k // MX_BLOCK, 4)  # vLLM pads the scale groups to 4 on sm90 (#47303)
    # Scale swizzle (8 warps): [groups, N] -> [N256/32, 32 * groups].
    _expect(name + " scale", scale, torch.uint8,
            [experts, _round_up(n, 2 * NUM_WARPS * 2 * 8) // 32, 32 * groups])
    # convert_layout builds each layout from the unswizzled storage's shape: the values' bytes
    # [E, K/2, N] (the quantised axis, 1, packs two codes a byte), the scales' [E, groups, N].
    value_layout = HopperMXValueLayout([experts, k // 2, n], mx_axis=1)
    scale_layout = HopperMXScaleLayout([experts, groups, n], mx_axis=1, num_warps=NUM_WARPS)
    w = Tensor(Storage(weight.mT, value_layout), dtype=FP4, shape=[experts, k, n])
    s = Tensor(Storage(scale.mT, scale_layout), dtype=torch.uint8, shape=[experts, groups, n])
    return w, s


def _precision_config(scale_tensor):
    """vLLM's PrecisionConfig(**mx_scale_kwargs(scale), flex_ctx=FlexCtx(rhs_data=InFlexData()))
    for the 3.5.1 API (the weight scale under `weight_scale`)."""
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
    from triton_kernels.numerics import InFlexData

    return PrecisionConfig(weight_scale=scale_tensor, flex_ctx=FlexCtx(rhs_data=InFlexData()))


def hopper_opt_flags() -> None:
    """The process-wide constraint vLLM's _swizzle_mxfp4 sets on sm90 before the kernel ever runs
    (split_k 1): part of the state vLLM's TRITON post-processing leaves."""
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags

    opt_flags.update_opt_flags_constraints({"split_k": 1})


def wrap_triton_mxfp4(w13_weight: torch.Tensor, w2_weight: torch.Tensor,
                      w13_scale: torch.Tensor, w2_scale: torch.Tensor, *, hidden: int,
                      inter_padded: int) -> TritonMxfp4Weights:
    """A triton-mxfp4 layer's four swizzled buffers (moepack.json's w13/w2 weight and scale
    roles; U8, docs/triton_mxfp4.md "What moepack writes") as the triton_kernels objects vLLM's
    TRITON post-processing leaves for gpt-oss: w13 a GEMM from `hidden` (H) to 2 * `inter_padded`
    (2Ip, gate/up rows interleaved), w2 from Ip to H. The Tensors view the buffers (no copy), so
    the buffers must outlive them. Raises TritonMxfp4Error naming the buffer whose dtype or shape
    does not follow from H and Ip, and for a triton_kernels whose API is not vLLM 0.33's."""
    api = triton_kernels_api()
    if api != TRITON_KERNELS_API:
        raise TritonMxfp4Error(f"triton_kernels API {api}: triton-mxfp4 is the Hopper swizzle of "
                               f"the {TRITON_KERNELS_API} API vLLM 0.33 vendors")
    if inter_padded % 64:
        raise TritonMxfp4Error(f"w13: intermediate {inter_padded} is not padded to 64 as vLLM "
                               "0.33 pads it for TRITON")
    w13, s13 = _wrap_projection("w13", w13_weight, w13_scale, hidden, 2 * inter_padded)
    w2, s2 = _wrap_projection("w2", w2_weight, w2_scale, inter_padded, hidden)
    if w13.shape[0] != w2.shape[0]:
        raise TritonMxfp4Error(f"w2: {w2.shape[0]} experts, w13 has {w13.shape[0]}")
    hopper_opt_flags()
    return TritonMxfp4Weights(w13=w13, w2=w2, w13_precision=_precision_config(s13),
                              w2_precision=_precision_config(s2))

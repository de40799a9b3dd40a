"""Records of the plugin's serving calls, replayed on the real kernel.

vLLM 0.33.0 cannot run whole on the device machine: its wheel pins torch==2.14.0 (the image has
torch 2.11.0) and installs 834 MB with ~60 packages the image lacks, against a 64 MiB carry. So
the plugin serves each artifact in the real vLLM 0.33.0 on the CPU (test_serving_replay.py),
and every call vLLM's MoE block makes to the CUDA-only ops is recorded with its exact arguments:
the parameters the plugin loaded (the same tensors, byte for byte), the quantisation type, the
sizes, the flags, the routing. `replay` runs such a record again through a given
`moe_wna16_marlin_gemm`: the CPU stand-in here, the wheel's shipped op on the H100
(gpu_replay.py). The activation between the two GEMMs and the top-k sum are recomputed from the
first GEMM's output, so a replay is the whole expert computation, not a comparison of stored
intermediates.

Shared by the CPU test and the device script; torch only.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

GEMM_ARGS = ("input", "output", "b_qweight", "b_bias", "b_scales", "a_scales", "global_scale",
             "b_qzeros", "workspace", "sorted_token_ids", "expert_ids", "num_tokens_past_padded",
             "topk_weights", "moe_block_size", "top_k", "mul_topk_weights", "b_q_type", "size_m",
             "size_n", "size_k", "use_atomic_add", "use_fp32_reduce", "is_zp_float", "thread_k",
             "thread_n", "blocks_per_sm")


def bind_gemm_call(wrapper, args, kwargs) -> dict:
    """The call's arguments by name, as vLLM's `_custom_ops.moe_wna16_marlin_gemm` binds them
    (defaults applied), with the quantisation type as the id the op takes and every tensor
    copied (the caller reuses its buffers)."""
    bound = inspect.signature(wrapper).bind(*args, **kwargs)
    bound.apply_defaults()
    names = tuple(bound.arguments)
    assert names == GEMM_ARGS, f"vLLM's moe_wna16_marlin_gemm signature changed: {names}"
    rec = {}
    for name, value in bound.arguments.items():
        if name == "b_q_type":
            value = int(value.id)
        elif isinstance(value, torch.Tensor):
            value = value.detach().clone()
        rec[name] = value
    return rec


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha=1.702, limit=7.0) -> torch.Tensor:
    gate = gate.clamp(max=limit)
    up = up.clamp(-limit, limit)
    return gate * torch.sigmoid(alpha * gate) * (up + 1)


def activate(name: str, c1: torch.Tensor) -> torch.Tensor:
    """The activation between the GEMMs, in fp32, by vLLM's MoEActivation name."""
    x = c1.float()
    if name == "SILU":
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
    if name == "SWIGLUOAI":  # gpt-oss: gate and up interleaved
        return swiglu_oai(x[..., 0::2], x[..., 1::2])
    raise ValueError(f"no replay for activation {name}")


def gemm_args(rec: dict, device, workspace, **override) -> list:
    """The recorded call's arguments in the op's order, on `device`, with `override`."""
    out = []
    for name in GEMM_ARGS:
        v = override[name] if name in override else rec[name]
        if name == "workspace":
            v = workspace
        elif name == "output":
            v = None
        elif isinstance(v, torch.Tensor):
            v = v.to(device)
        out.append(v)
    return out


def replay(record: dict, gemm, device="cpu", workspace=None, weights=None) -> torch.Tensor:
    """[M, H] fp32: the record's expert computation through `gemm` (the op's positional
    signature, `b_q_type` as its id). `weights` replaces operands by name for both GEMMs
    ({"w13": {...}, "w2": {...}}: a corruption)."""
    g1, g2 = record["gemms"]
    weights = weights or {}
    if workspace is None:
        workspace = torch.zeros(1, dtype=torch.int32, device=device)
    c1 = gemm(*gemm_args(g1, device, workspace, **weights.get("w13", {})))
    act = activate(record["activation"], c1.view(-1, g1["size_n"])).to(c1.dtype)
    workspace.zero_()
    c2 = gemm(*gemm_args(g2, device, workspace, input=act, **weights.get("w2", {})))
    M, topk = record["tokens"], g1["top_k"]
    return c2.view(M, topk, -1).float().sum(1)[:, :record["hidden"]].cpu()

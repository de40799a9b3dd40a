"""vLLM 0.33's whole MoE forward on a loaded moepack artifact, on the CPU.

vLLM's own MoE block runs (router, runner, modular kernel, MarlinExperts, fused_marlin_moe); the
CUDA-only ops it calls are replaced by CPU stand-ins that compute from the parameters exactly as
the Marlin kernel reads them -- decoded here from docs/marlin.md, independently of moepack's C++:
  moe_align_block_size, moe_wna16_marlin_gemm (tiles, permuted scales, interleaved zeros), the
  activation (silu(gate) * up) and the top-k sum.
The result is compared with an fp32 reference computed from the *source* checkpoint's tensors
(GPTQ / AWQ / compressed-tensors, decoded here too) for the experts and weights the router chose.
A right layout lands within bf16 rounding; a wrong one (the w13 scales permuted as vLLM's loader
would, `--vllm-w13-scale-size-k`) does not.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import vllm_harness as h
from layouts import marlin_weight, source_linear

# The Marlin layout, named: on sm90 (convert's default arch) for vLLM 0.33 `auto` writes Humming
# (test_serving_humming.py).
MARLIN = ("--backend", "marlin")
RIGHT_TOL = 2e-2  # bf16 activations and intermediates: ~4e-3 expected
WRONG_MIN = 0.2

# ---- CPU stand-ins for the CUDA-only ops ----

class StandIns:
    def __init__(self, monkeypatch):
        import vllm._custom_ops as ops
        from vllm.model_executor.layers.fused_moe.experts import marlin_moe

        self.routing = None
        self.cache: dict = {}
        monkeypatch.setattr(marlin_moe, "moe_align_block_size", self.align)
        monkeypatch.setattr(marlin_moe, "get_marlin_workspace", lambda dev: torch.zeros(1))
        monkeypatch.setattr(ops, "moe_wna16_marlin_gemm", self.gemm)
        monkeypatch.setattr(marlin_moe.MarlinExperts, "activation", self.activation)
        monkeypatch.setattr(marlin_moe.MarlinExperts, "moe_sum", self.moe_sum)

    def align(self, topk_ids, block_size, num_experts, expert_map=None, **kw):
        """moe_align_block_size: blocks of each expert's token slots; under expert parallelism
        (expert_map: global id -> local index, -1 elsewhere) only this rank's experts, by their
        local index, as the CUDA op with ignore_invalid_experts."""
        flat = topk_ids.flatten()
        self.topk_ids = topk_ids.clone()
        ids, experts = [], []
        for e in range(num_experts):
            local = e if expert_map is None else int(expert_map[e])
            idx = (flat == e).nonzero().flatten().tolist()
            if not idx or local < 0:
                continue
            pad = (-len(idx)) % block_size
            ids += idx + [flat.numel()] * pad
            experts += [local] * ((len(idx) + pad) // block_size)
        return (torch.tensor(ids, dtype=torch.int32), torch.tensor(experts, dtype=torch.int32),
                torch.tensor([len(ids)], dtype=torch.int32))

    def gemm(self, a, c, b_qweight, b_bias, b_scales, a_scales, global_scale, b_qzeros,
             workspace, sorted_token_ids, expert_ids, num_tokens_post_padded, topk_weights,
             moe_block_size, top_k, mul_topk_weights, b_q_type, size_m, size_n, size_k,
             *rest, **kw):
        assert b_bias is None and a_scales is None and global_scale is None
        bits = b_q_type.size_bits
        self.topk_weights = topk_weights.clone()
        out = torch.zeros(size_m * top_k, size_n)
        n_ids = int(num_tokens_post_padded[0])
        for blk in range(n_ids // moe_block_size):
            e = int(expert_ids[blk])
            ids = sorted_token_ids[blk * moe_block_size:(blk + 1) * moe_block_size].long()
            ids = ids[ids < size_m * top_k]
            key = (b_qweight.data_ptr(), e)
            if key not in self.cache:
                self.cache[key] = marlin_weight(
                    b_qweight[e], b_scales[e], None if b_qzeros is None else b_qzeros[e],
                    bits, size_k, size_n)
            y = a[ids // top_k].float() @ self.cache[key]
            if mul_topk_weights:
                y = y * topk_weights.flatten()[ids].unsqueeze(1)
            out[ids] = y
        if c is None:
            c = torch.empty(size_m * top_k, size_n, dtype=a.dtype)
        c.view(size_m * top_k, size_n).copy_(out.to(c.dtype))
        return c

    @staticmethod
    def activation(self, activation, output, input, **kw):
        d = input.shape[-1] // 2
        output.copy_((F.silu(input[..., :d].float()) * input[..., d:].float()).to(output.dtype))

    @staticmethod
    def moe_sum(self, input, output, topk_ids=None, expert_map=None):
        output.copy_(
            input.view(output.shape[0], -1, output.shape[-1]).float().sum(1).to(output.dtype))


def reference(src, layer_prefix, fmt, bits, x, topk_ids, topk_weights, names):
    t = {}
    for f in sorted(src.glob("*.safetensors")):
        t.update(load_file(str(f)))
    gate, up, down = names
    out = torch.zeros(x.shape[0], x.shape[1])
    for i in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[i, j])
            p = f"{layer_prefix}.{e}."
            xi = x[i].float()
            hmid = F.silu(xi @ source_linear(t, p + gate, fmt, bits)) * (
                xi @ source_linear(t, p + up, fmt, bits))
            out[i] += float(topk_weights[i, j]) * (hmid @ source_linear(t, p + down, fmt, bits))
    return out


CASES = {  # synth format -> (source decode, bits)
    "gptq": ("gptq", 4), "awq": ("awq", 4), "ct-w4a16": ("ct", 4), "ct-w8a16": ("ct", 8),
}


def run_moe(plugin, monkeypatch, src, dst, family):
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    stand = StandIns(monkeypatch)
    model, cfg = h.load_model(str(dst))
    manifest = json.loads((dst / "moepack.json").read_text())
    L = manifest["layers"][0]
    block = model.get_submodule(L["module"])
    torch.manual_seed(0)
    x = torch.randn(16, L["hidden"]).to(torch.bfloat16)
    with set_current_vllm_config(cfg), set_forward_context(None, cfg, num_tokens=x.shape[0]):
        y = block(x).float()
    prefix = L["module"] + ".experts"  # the source experts (param_prefix has the target child)
    names = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    return y, x, stand, prefix, names


@pytest.mark.parametrize("fmt,family", [("gptq", "qwen3"), ("awq", "qwen3"),
                                        ("ct-w4a16", "mixtral"), ("ct-w8a16", "qwen3")])
def test_vllm_moe_forward_matches_source_reference(plugin, artifacts, monkeypatch, fmt, family):
    src, dst = artifacts.get(fmt, family, *MARLIN)
    y, x, stand, prefix, names = run_moe(plugin, monkeypatch, src, dst, family)
    dec, bits = CASES[fmt]
    ref = reference(src, prefix, dec, bits, x, stand.topk_ids, stand.topk_weights, names)
    err = float((y - ref).norm() / ref.norm())
    print(f"{fmt}/{family}: normalized error {err:.3e}")
    assert err < RIGHT_TOL, f"{fmt}/{family}: |y - ref| / |ref| = {err:.3e}"


def test_vllm_moe_forward_catches_loader_scale_permutation(plugin, artifacts, monkeypatch):
    """w13 scales permuted by vLLM's loader rule (single, since size_k = I for GPTQ) where the
    kernel reads grouped (two groups along H): the forward is far off."""
    src, dst = artifacts.get("gptq", "qwen3", "--vllm-w13-scale-size-k", *MARLIN)
    y, x, stand, prefix, names = run_moe(plugin, monkeypatch, src, dst, "qwen3")
    ref = reference(src, prefix, "gptq", 4, x, stand.topk_ids, stand.topk_weights, names)
    err = float((y - ref).norm() / ref.norm())
    print(f"gptq/qwen3 with the loader's w13 scale permutation: normalized error {err:.3e}")
    assert err > WRONG_MIN, f"a wrong layout passed: {err:.3e}"

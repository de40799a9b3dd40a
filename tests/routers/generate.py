#!/usr/bin/env python3
"""Regenerates tests/routers/fixtures/: every MoE family's router and expert activation as
transformers' own modeling code computes them, on random inputs.

Run with a python that has torch, safetensors and transformers (the versions are recorded in
fixtures/versions.json; CPU only, no hub access):

    ~/.cache/moepack/venv-vllm-0.33.0/bin/python tests/routers/generate.py

For each family, fixtures/<name>/ holds
  config.json          the family's config (config.to_dict(), as save_pretrained writes it)
  router.safetensors   x [T, H] (float32), the router's tensors under their names in the MoE
                       block's state_dict (the router module's own names, prefixed), and what
                       transformers computed: ids [T, k] (int32) and weights [T, k] (float32)
  names.json           which state_dict name is which router input (weight, bias,
                       correction_bias, per_expert_scale, input_scale)
and fixtures/activations.safetensors holds gate/up values and transformers' outputs of
gpt-oss' GptOssExperts._apply_gate and Gemma-4's gelu_pytorch_tanh GLU.

tests/routers/transformers_routers.cpp compares moepack's routers (verify/router.h,
model/routing.h) against these files. Nothing here runs at build or test time.
"""
import importlib.metadata as md
import json
import os

import torch
import transformers as tf
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
T, H = 48, 32


def mod(name):
    import importlib
    return importlib.import_module(f"transformers.models.{name}.modeling_{name}")


def randomize(module, gen):
    with torch.no_grad():
        for n, p in module.named_parameters(recurse=True):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for n, b in module.named_buffers(recurse=True):
            b.copy_(torch.randn(b.shape, generator=gen) * 0.1)


def family(name, config, build, run, names, scales=None):
    """build(config) -> router module; run(module, x) -> (ids [T, k], weights [T, k])."""
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    router = build(config).eval()
    randomize(router, gen)
    if scales:
        scales(router, gen)
    x = torch.randn(T, H, generator=gen)
    with torch.no_grad():
        ids, weights = run(router, x)
    state = {k: v.detach().float().contiguous() for k, v in router.state_dict().items()}
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    tensors = {"x": x.contiguous(), "ids": ids.to(torch.int32).contiguous(),
               "weights": weights.float().contiguous()}
    for role, key in names.items():
        tensors["router." + key] = state[key]
    save_file(tensors, os.path.join(d, "router.safetensors"))
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config.to_dict(), f, indent=1, sort_keys=True, default=str)
    with open(os.path.join(d, "names.json"), "w") as f:
        json.dump({role: "router." + key for role, key in names.items()}, f, indent=1)
    print(name, tuple(ids.shape))


def topk_router():
    """Routers returning (logits, weights, ids)."""
    def run(router, x):
        out = router(x)
        return out[2], out[1]
    return run


def main():
    os.makedirs(OUT, exist_ok=True)
    # --- the families moepack had
    family("mixtral", tf.MixtralConfig(hidden_size=H, num_local_experts=8, num_experts_per_tok=2),
           lambda c: mod("mixtral").MixtralTopKRouter(c), topk_router(), {"weight": "weight"})
    family("qwen3_moe", tf.Qwen3MoeConfig(hidden_size=H, num_experts=16, num_experts_per_tok=4,
                                          norm_topk_prob=False),
           lambda c: mod("qwen3_moe").Qwen3MoeTopKRouter(c), topk_router(), {"weight": "weight"})
    family("deepseek_v3", tf.DeepseekV3Config(hidden_size=H, n_routed_experts=16,
                                              num_experts_per_tok=4, n_group=4, topk_group=2,
                                              routed_scaling_factor=2.5),
           lambda c: mod("deepseek_v3").DeepseekV3TopkRouter(c), topk_router(),
           {"weight": "weight", "correction_bias": "e_score_correction_bias"})
    family("glm4_moe", tf.Glm4MoeConfig(hidden_size=H, n_routed_experts=16, num_experts_per_tok=4,
                                        n_group=2, topk_group=1, routed_scaling_factor=1.5),
           lambda c: mod("glm4_moe").Glm4MoeTopkRouter(c), topk_router(),
           {"weight": "weight", "correction_bias": "e_score_correction_bias"})
    gpt = mod("gpt_oss")

    def run_gpt(router, x):
        logits, scores, ids = router(x)
        return ids, scores
    family("gpt_oss", tf.GptOssConfig(hidden_size=H, num_local_experts=8, num_experts_per_tok=4),
           lambda c: gpt.GptOssTopKRouter(c), run_gpt, {"weight": "weight", "bias": "bias"})
    # --- the families of issue 30
    family("olmoe", tf.OlmoeConfig(hidden_size=H, num_experts=16, num_experts_per_tok=4,
                                   norm_topk_prob=False),
           lambda c: mod("olmoe").OlmoeTopKRouter(c), topk_router(), {"weight": "weight"})

    def run_phimoe(router, x):
        logits, weights, ids = router(x)
        return ids, weights
    family("phimoe", tf.PhimoeConfig(hidden_size=H, num_local_experts=8, num_experts_per_tok=2,
                                     router_jitter_noise=0.01),
           lambda c: mod("phimoe").PhimoeTopKRouter(c), run_phimoe, {"weight": "weight"})
    # A jitter wide enough that the softmaxes take several logits.
    family("phimoe_wide", tf.PhimoeConfig(hidden_size=H, num_local_experts=8,
                                          num_experts_per_tok=2, router_jitter_noise=0.5),
           lambda c: mod("phimoe").PhimoeTopKRouter(c), run_phimoe, {"weight": "weight"})
    family("ernie4_5_moe", tf.Ernie4_5_MoeConfig(hidden_size=H, moe_num_experts=16, moe_k=4),
           lambda c: mod("ernie4_5_moe").Ernie4_5_MoeTopKRouter(c), topk_router(),
           {"weight": "weight", "correction_bias": "moe_statics.e_score_correction_bias"})
    ll = mod("llama4")

    def run_llama4(router, x):
        scores, logits = router(x)
        ids = torch.topk(logits, router.top_k, dim=1).indices
        return ids, scores.gather(1, ids)
    family("llama4_text", tf.Llama4TextConfig(hidden_size=H, num_local_experts=8,
                                              num_experts_per_tok=1),
           lambda c: ll.Llama4Router(c), run_llama4, {"weight": "weight"})
    mm = mod("minimax_m2")

    class MiniMaxGate(torch.nn.Module):  # the block's gate and its bias, nothing else
        def __init__(self, c):
            super().__init__()
            self.gate = mm.MiniMaxM2TopKRouter(c)
            self.e_score_correction_bias = torch.nn.Parameter(torch.zeros(c.num_local_experts))

        def forward(self, x):
            return self.gate(x, self.e_score_correction_bias)
    family("minimax_m2", tf.MiniMaxM2Config(hidden_size=H, num_local_experts=16,
                                            num_experts_per_tok=4),
           MiniMaxGate, topk_router(),
           {"weight": "gate.weight", "correction_bias": "e_score_correction_bias"})

    def run_granite(router, x):
        ids, weights, logits = router(x)
        return ids, weights
    family("granitemoe", tf.GraniteMoeConfig(hidden_size=H, num_local_experts=8,
                                             num_experts_per_tok=2),
           lambda c: mod("granitemoe").GraniteMoeTopKRouter(c), run_granite, {"weight": "weight"})
    family("granitemoeshared", tf.GraniteMoeSharedConfig(hidden_size=H, num_local_experts=8,
                                                         num_experts_per_tok=3),
           lambda c: mod("granitemoeshared").GraniteMoeSharedTopKRouter(c)
           if hasattr(mod("granitemoeshared"), "GraniteMoeSharedTopKRouter")
           else mod("granitemoe").GraniteMoeTopKRouter(c), run_granite, {"weight": "weight"})
    family("glm4_moe_lite", tf.Glm4MoeLiteConfig(hidden_size=H, n_routed_experts=16,
                                                 num_experts_per_tok=4, n_group=4, topk_group=2),
           lambda c: mod("glm4_moe_lite").Glm4MoeLiteTopkRouter(c), topk_router(),
           {"weight": "weight", "correction_bias": "e_score_correction_bias"})
    family("mistral4", tf.Mistral4Config(hidden_size=H, n_routed_experts=16, num_experts_per_tok=4,
                                         n_group=4, topk_group=2, routed_scaling_factor=1.5),
           lambda c: mod("mistral4").Mistral4TopkRouter(c), topk_router(), {"weight": "weight"})
    family("deepseek_v32", tf.DeepseekV32Config(hidden_size=H, n_routed_experts=16,
                                                num_experts_per_tok=4, n_group=4, topk_group=2),
           lambda c: mod("deepseek_v32").DeepseekV32TopkRouter(c), topk_router(),
           {"weight": "weight", "correction_bias": "e_score_correction_bias"})

    def gemma_scales(router, gen):
        with torch.no_grad():
            router.scale.copy_(1.0 + 0.3 * torch.randn(router.scale.shape, generator=gen))
            router.per_expert_scale.copy_(1.0 + 0.3 * torch.randn(router.per_expert_scale.shape,
                                                                  generator=gen))
    family("gemma4_text", tf.Gemma4TextConfig(hidden_size=H, num_experts=16, top_k_experts=4,
                                              enable_moe_block=True, moe_intermediate_size=16),
           lambda c: mod("gemma4").Gemma4TextRouter(c), topk_router(),
           {"weight": "proj.weight", "per_expert_scale": "per_expert_scale",
            "input_scale": "scale"}, scales=gemma_scales)

    # --- activations
    gen = torch.Generator().manual_seed(30)
    gate = torch.randn(4096, generator=gen) * 6
    up = torch.randn(4096, generator=gen) * 6
    gcfg = tf.GptOssConfig(hidden_size=H, intermediate_size=16, num_local_experts=2)
    experts = gpt.GptOssExperts(gcfg)
    # _apply_gate reads the interleaved gate_up ([..., ::2] gate, [..., 1::2] up).
    inter = torch.empty(1, 2 * gate.numel())
    inter[0, 0::2] = gate
    inter[0, 1::2] = up
    swiglu = experts._apply_gate(inter)[0]
    from transformers.activations import ACT2FN
    gelu = ACT2FN["gelu_pytorch_tanh"](gate) * up
    silu = ACT2FN["silu"](gate) * up
    save_file({"gate": gate.contiguous(), "up": up.contiguous(), "swigluoai": swiglu.contiguous(),
               "gelu_tanh": gelu.contiguous(), "silu": silu.contiguous()},
              os.path.join(OUT, "activations.safetensors"))
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        json.dump({"transformers": tf.__version__, "torch": torch.__version__,
                   "safetensors": md.version("safetensors"),
                   "swiglu": {"alpha": float(experts.alpha), "limit": float(experts.limit)}}, f,
                  indent=1)


if __name__ == "__main__":
    main()

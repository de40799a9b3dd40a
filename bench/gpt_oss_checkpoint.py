#!/usr/bin/env python3
"""A random gpt-oss MXFP4 checkpoint of any size, in the published format (the tensors and config
of tests/gpt_oss/fixtures/mxfp4, which transformers 5.17 loads; docs/gpt-oss.md): one
gate_up_proj_blocks [E, 2I, H/32, 16] / _scales / _bias (BF16) and down_proj_* per layer, the
router, attention and norms in BF16. For device benchmarks of shapes the committed fixture does
not have (bench/gpu_triton_mxfp4.sh). Needs torch and safetensors (the vLLM test venv has both).

  python bench/gpt_oss_checkpoint.py OUT --experts 2 --hidden 2880 --inter 256 --layers 1 --seed 0
"""
import argparse
import copy
import json
import os

import torch
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "tests", "gpt_oss", "fixtures", "mxfp4", "config.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--experts", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--inter", type=int, default=64)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=256)
    a = ap.parse_args()
    E, H, I, L = a.experts, a.hidden, a.inter, a.layers
    assert H % 32 == 0 and I % 32 == 0, "MXFP4 blocks of 32"
    g = torch.Generator().manual_seed(a.seed)
    cfg = copy.deepcopy(json.load(open(TEMPLATE)))
    heads, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    cfg.update(hidden_size=H, intermediate_size=I, num_local_experts=E, num_hidden_layers=L,
               num_experts_per_tok=min(a.top_k, E),
               layer_types=[("sliding_attention" if i % 2 == 0 else "full_attention")
                            for i in range(L)])
    cfg["vocab_size"] = V = a.vocab

    def bf16(*shape, scale=0.05):
        return (torch.randn(shape, generator=g) * scale).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": bf16(V, H), "lm_head.weight": bf16(V, H),
         "model.norm.weight": torch.ones(H, dtype=torch.bfloat16)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        t[p + "post_attention_layernorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
        for n, rows in (("q_proj", heads * hd), ("k_proj", kv * hd), ("v_proj", kv * hd)):
            t[p + f"self_attn.{n}.weight"] = bf16(rows, H)
            t[p + f"self_attn.{n}.bias"] = bf16(rows)
        t[p + "self_attn.o_proj.weight"] = bf16(H, heads * hd)
        t[p + "self_attn.o_proj.bias"] = bf16(H)
        t[p + "self_attn.sinks"] = bf16(heads)
        t[p + "mlp.router.weight"] = bf16(E, H, scale=1.0)
        t[p + "mlp.router.bias"] = bf16(E, scale=0.5)
        x = p + "mlp.experts."
        t[x + "gate_up_proj_blocks"] = torch.randint(0, 256, (E, 2 * I, H // 32, 16),
                                                     dtype=torch.uint8, generator=g)
        t[x + "gate_up_proj_scales"] = torch.randint(117, 124, (E, 2 * I, H // 32),
                                                     dtype=torch.uint8, generator=g)
        t[x + "gate_up_proj_bias"] = bf16(E, 2 * I, scale=0.5)
        t[x + "down_proj_blocks"] = torch.randint(0, 256, (E, H, I // 32, 16), dtype=torch.uint8,
                                                  generator=g)
        t[x + "down_proj_scales"] = torch.randint(117, 124, (E, H, I // 32), dtype=torch.uint8,
                                                  generator=g)
        t[x + "down_proj_bias"] = bf16(E, H, scale=0.5)
    os.makedirs(a.out, exist_ok=True)
    save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()

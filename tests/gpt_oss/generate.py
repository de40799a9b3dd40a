#!/usr/bin/env python3
"""Regenerates tests/gpt_oss/fixtures/: a tiny gpt-oss checkpoint in the exact on-disk format of
the published openai/gpt-oss-20b / -120b (MXFP4 experts), its bf16 variant (as the "-BF16"
re-uploads store it), and what transformers computes from them.

transformers' Mxfp4HfQuantizer cannot quantise on the CPU (quantize_to_mxfp4 needs the triton
kernels hub), so the MXFP4 tensors are written here from the format's definition: random e2m1
codes and E8M0 exponents, packed as transformers' own decoder (integrations/mxfp4.py,
_convert_moe_packed_tensors) and vLLM's loader (models/gpt_oss.py, _load_weights_mxfp4) read
them. transformers then LOADS the checkpoint (Mxfp4Config(dequantize=True), the CPU path) and
everything recorded as expected comes from the loaded model, not from this script's decode:

  mxfp4/               config.json (quantization_config: quant_method mxfp4 with the published
                       modules_to_not_convert) + model.safetensors
  bf16/                the same model with bf16 experts gate_up_proj [E, H, 2I] / down_proj
  expected.safetensors per layer L:
    L.gate_up_proj, L.down_proj          transformers' dequantised experts ([E, H, 2I] and
                                         [E, I, H], gate/up interleaved on the last axis; bf16,
                                         which holds each value exactly: asserted)
    L.gate_up_proj_bias, L.down_proj_bias
    L.x [T, H]                           random float32 inputs
    L.out [T, H]                         GptOssMLP(x) of the loaded model in float32 (router
                                         with bias, top-k then softmax, experts with biases,
                                         clamped SwiGLU on interleaved gate/up)
    L.router_ids [T, k] int32            GptOssTopKRouter's choice
  versions.json        transformers / torch / safetensors versions and the shape

Run (CPU only, no hub access):  /work/venv-producers/bin/python tests/gpt_oss/generate.py
tests/golden/gpt_oss.cpp compares moepack against these files; nothing here runs at test time.
"""
import importlib.metadata as md
import json
import os
import shutil

import numpy as np
import torch
import transformers as tf
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")
E, H, I, K_TOP, LAYERS, T = 4, 64, 64, 2, 2, 24
# openai/gpt-oss-20b's config.json quantization_config, verbatim.
QUANT = {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                    "model.embed_tokens", "lm_head"],
         "quant_method": "mxfp4"}
FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)


def mxfp4_tensors(rng, n, k):
    """Random codes [E, n, k] and E8M0 exponents [E, n, k/32] -> (blocks [E, n, k/32, 16],
    scales [E, n, k/32]) as stored: byte j of a block holds k = 2j (low nibble) and 2j + 1."""
    codes = rng.integers(0, 16, size=(E, n, k), dtype=np.uint8)
    scales = rng.integers(118, 127, size=(E, n, k // 32), dtype=np.uint8)  # 2^-9 .. 2^-1
    pairs = codes.reshape(E, n, k // 32, 16, 2)
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).astype(np.uint8)
    return blocks, scales


def main():
    torch.manual_seed(26)
    rng = np.random.default_rng(26)
    config = tf.GptOssConfig(
        vocab_size=256, hidden_size=H, intermediate_size=I, num_hidden_layers=LAYERS,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, num_local_experts=E,
        num_experts_per_tok=K_TOP, sliding_window=16, max_position_embeddings=256,
        layer_types=["sliding_attention", "full_attention"], swiglu_limit=7.0,
        tie_word_embeddings=False)
    model = tf.GptOssForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape) * (0.02 if "embed" in name or "lm_head" in name else 0.3))

    dense = {k: v.contiguous() for k, v in model.state_dict().items()}
    mx = {k: v for k, v in dense.items()
          if not k.endswith((".mlp.experts.gate_up_proj", ".mlp.experts.down_proj"))}
    bf = dict(mx)
    for L in range(LAYERS):
        X = f"model.layers.{L}.mlp.experts."
        for proj, n, k in (("gate_up_proj", 2 * I, H), ("down_proj", H, I)):
            blocks, scales = mxfp4_tensors(rng, n, k)
            mx[X + proj + "_blocks"] = torch.from_numpy(blocks)
            mx[X + proj + "_scales"] = torch.from_numpy(scales)
            # bf16 variant: the same values (exact in bf16), [E, in, out] as transformers holds them.
            lo, hi = blocks & 0x0F, blocks >> 4
            vals = np.stack([FP4[lo], FP4[hi]], axis=-1).reshape(E, n, k // 32, 32)
            vals = vals * np.exp2(scales.astype(np.float32) - 127)[..., None]
            bf[X + proj] = torch.from_numpy(vals.reshape(E, n, k)).transpose(1, 2).to(
                torch.bfloat16).contiguous()
    shutil.rmtree(OUT, ignore_errors=True)
    for sub, tensors, quant in (("mxfp4", mx, QUANT), ("bf16", bf, None)):
        d = os.path.join(OUT, sub)
        os.makedirs(d)
        cfg = config.to_dict()
        cfg["architectures"] = ["GptOssForCausalLM"]
        cfg["torch_dtype"] = "bfloat16"
        cfg.pop("dtype", None)
        if quant:
            cfg["quantization_config"] = quant
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
        save_file({k: tensors[k] for k in sorted(tensors)}, os.path.join(d, "model.safetensors"),
                  metadata={"format": "pt"})

    # Load both as transformers does and record what it computes.
    loaded = tf.GptOssForCausalLM.from_pretrained(
        os.path.join(OUT, "mxfp4"), quantization_config=tf.Mxfp4Config(dequantize=True),
        dtype=torch.float32, experts_implementation="eager").float().eval()  # dequant gives bf16
    loaded_bf = tf.GptOssForCausalLM.from_pretrained(os.path.join(OUT, "bf16"),
                                                     dtype=torch.float32,
                                                     experts_implementation="eager").float().eval()
    expected = {}
    gen = torch.Generator().manual_seed(2626)
    for L in range(LAYERS):
        mlp, mlp_bf = loaded.model.layers[L].mlp, loaded_bf.model.layers[L].mlp
        for name in ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias"):
            t = getattr(mlp.experts, name).detach()
            assert torch.equal(t, getattr(mlp_bf.experts, name).detach()), name
            # bf16 holds every dequantised value exactly (e2m1 x 2^e); assert it, store bf16.
            assert torch.equal(t.to(torch.bfloat16).float(), t), name
            expected[f"{L}.{name}"] = t.to(torch.bfloat16).contiguous()
        x = torch.randn(T, H, generator=gen)
        with torch.no_grad():
            out, _ = mlp(x[None])
            out_bf, _ = mlp_bf(x[None])
            _, _, ids = mlp.router(x)
        assert torch.equal(out, out_bf)
        expected[f"{L}.x"] = x.contiguous()
        expected[f"{L}.out"] = out[0].float().contiguous()
        expected[f"{L}.router_ids"] = ids.to(torch.int32).contiguous()
    save_file(expected, os.path.join(OUT, "expected.safetensors"))
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        json.dump({"transformers": tf.__version__, "torch": torch.__version__,
                   "safetensors": md.version("safetensors"), "numpy": np.__version__,
                   "experts": E, "hidden_size": H, "intermediate_size": I, "top_k": K_TOP,
                   "layers": LAYERS, "tokens": T,
                   "loaded_with": "GptOssForCausalLM.from_pretrained(..., quantization_config="
                                  "Mxfp4Config(dequantize=True), dtype=torch.float32, "
                                  "experts_implementation='eager').float()"},
                  f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()

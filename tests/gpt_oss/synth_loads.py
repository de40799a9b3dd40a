#!/usr/bin/env python3
"""`moepack synth --format gpt-oss-mxfp4` (and `--family gpt_oss --format bf16`) output loads in the
reader the gpt-oss fixture was made with (tests/gpt_oss/generate.py): transformers'
GptOssForCausalLM, the MXFP4 checkpoint through Mxfp4Config(dequantize=True). Checks, per layer:
  - transformers' dequantised gate_up_proj [E, H, 2I] / down_proj [E, I, H] equal an independent
    decode of the file's _blocks / _scales (e2m1 table x 2^(scale - 127), low nibble first,
    transposed as transformers holds them), and the biases the file's;
  - the bf16 variant's parameters equal its file's tensors;
  - both models run a forward pass (config and attention shapes coherent) with finite logits,
    and the MXFP4 one's MoE block gives finite, nonzero outputs.

  python synth_loads.py MXFP4_DIR BF16_DIR
"""
import json
import os
import sys

import numpy as np
import torch
import transformers as tf
from safetensors import safe_open

E2M1 = np.array([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def read_all(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(d, f), "pt") as s:
                assert s.metadata() == {"format": "pt"} or s.metadata() is None, s.metadata()
                for k in s.keys():
                    out[k] = s.get_tensor(k)
    return out


def decode(blocks, scales):
    """[E, N, K/32, 16] U8 and [E, N, K/32] U8 -> float32 [E, N, K] (not transformers' code)."""
    b = blocks.numpy()
    codes = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(*b.shape[:2], -1)  # low nibble first
    e, n, k = codes.shape
    vals = E2M1[codes].reshape(e, n, k // 32, 32)
    exp = scales.numpy().astype(np.int32) - 127
    return torch.from_numpy(np.ldexp(vals, exp[..., None]).reshape(e, n, k).astype(np.float32))


def check(mx_dir, bf_dir):
    cfg = json.load(open(os.path.join(mx_dir, "config.json")))
    assert cfg["quantization_config"]["quant_method"] == "mxfp4"
    L, H = cfg["num_hidden_layers"], cfg["hidden_size"]
    raw, raw_bf = read_all(mx_dir), read_all(bf_dir)
    mx, info = tf.GptOssForCausalLM.from_pretrained(
        mx_dir, quantization_config=tf.Mxfp4Config(dequantize=True), dtype=torch.float32,
        experts_implementation="eager", output_loading_info=True)
    bf, info_bf = tf.GptOssForCausalLM.from_pretrained(
        bf_dir, dtype=torch.float32, experts_implementation="eager", output_loading_info=True)
    for d, got in ((mx_dir, info), (bf_dir, info_bf)):
        bad = {k: v for k, v in got.items() if v and k != "error_msgs" or k == "error_msgs" and v}
        assert not bad, f"{d}: transformers loading info {bad}"
    mx, bf = mx.float().eval(), bf.float().eval()
    checked = 0
    for i in range(L):
        p = f"model.layers.{i}.mlp."
        ex, ex_bf = mx.model.layers[i].mlp.experts, bf.model.layers[i].mlp.experts
        for proj in ("gate_up_proj", "down_proj"):
            want = decode(raw[p + f"experts.{proj}_blocks"], raw[p + f"experts.{proj}_scales"])
            have = getattr(ex, proj).detach()
            assert have.shape == want.transpose(1, 2).shape, (proj, have.shape, want.shape)
            assert torch.equal(have, want.transpose(1, 2)), f"layer {i} {proj}: dequant differs"
            assert want.abs().sum() > 0, f"layer {i} {proj}: all zero"
            assert torch.equal(getattr(ex_bf, proj).detach(),
                               raw_bf[p + f"experts.{proj}"].float()), f"layer {i} bf16 {proj}"
            bias = proj + "_bias"
            assert torch.equal(getattr(ex, bias).detach(), raw[p + "experts." + bias].float())
            assert torch.equal(getattr(ex_bf, bias).detach(), raw_bf[p + "experts." + bias].float())
            checked += 1
        assert torch.equal(mx.model.layers[i].mlp.router.weight.detach(),
                           raw[p + "router.weight"].float())
        x = torch.randn(1, 5, H, generator=torch.Generator().manual_seed(i))
        with torch.no_grad():
            out = mx.model.layers[i].mlp(x)[0]
        assert torch.isfinite(out).all() and out.abs().sum() > 0, f"layer {i}: MoE output"
    ids = torch.arange(6)[None] % cfg["vocab_size"]
    with torch.no_grad():
        for m in (mx, bf):
            assert torch.isfinite(m(ids).logits).all()
    print(f"OK: {mx_dir} and {bf_dir} load in transformers {tf.__version__}: {L} layers, "
          f"{checked} expert projections dequantised equal to the file's blocks and scales")


if __name__ == "__main__":
    check(sys.argv[1], sys.argv[2])

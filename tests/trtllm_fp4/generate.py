#!/usr/bin/env python3
"""Regenerates tests/trtllm_fp4/fixtures/: what vLLM 0.33.0 leaves on a FusedMoE layer for the
FlashInfer TRT-LLM-Gen FP4 MoE backends, computed by vLLM's and FlashInfer 0.7.2.post1's own
functions on the CPU, for tests/golden/trtllm_fp4.cpp to compare moepack's trtllm-mxfp4 bytes
with (docs/trtllm_fp4.md).

  mxfp4_<case>.safetensors   gpt-oss MXFP4, FLASHINFER_TRTLLM_MXFP4_BF16:
    in.gate_up_blocks U8 [E, 2I, H/32, 16], in.gate_up_scales U8 [E, 2I, H/32],
    in.gate_up_bias BF16 [E, 2I] (gate/up rows interleaved, as the checkpoint stores them),
    in.down_blocks U8 [E, H, I/32, 16], in.down_scales U8 [E, H, I/32], in.down_bias BF16 [E, H]:
        random codes, E8M0 exponents and biases;
    out.w13_weight, out.w2_weight, out.w13_weight_scale, out.w2_weight_scale, out.w13_bias,
    out.w2_bias: what convert_gpt_oss_weight_to_mxfp4_moe_kernel_format
        (vllm/model_executor/layers/fused_moe/oracle/mxfp4.py) returns for the layer the gpt-oss
        loader fills: parameters of GptOssMxfp4MoEMethod.create_weights' shapes on the sizes
        mxfp4_round_up_hidden_size_and_intermediate_size gives (vLLM's own function, called
        here), zero-initialised, the checkpoint copied into their leading rows and columns
        (RoutedExperts.weight_loader's gpt_oss_mxfp4 branch: param.data[:, :dim1, :dim2]).
  manifest.json              the cases, and the vLLM / FlashInfer / torch versions.

The functions run unchanged, on CPU tensors: FlashInfer's row indices
(get_w2_permute_indices_with_cache, plain torch) and its block_scale_interleave on its host path
(fixture_common.py: the Python wrapper's device query bypassed).

Run (CPU only; the first run JIT-compiles FlashInfer's fp4 module, minutes):
  ~/.cache/moepack/venv-vllm-0.33.0/bin/python tests/trtllm_fp4/generate.py
Nothing here runs at test time.
"""
import torch

# Before vLLM: FlashInfer's block-scale interleave on the CPU (fixture_common.py).
from fixture_common import save_fixture, write_manifest

from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as vllm_mxfp4  # noqa: E402

# (name, E, H, I): unpadded, padded H and I, the smallest legal layer, uneven paddings.
MXFP4_CASES = [
    ("e2_h64_i64", 2, 64, 64),
    ("e1_h256_i128", 1, 256, 128),
    ("e1_h288_i160", 1, 288, 160),
    ("e1_h32_i32", 1, 32, 32),
    ("e2_h96_i96", 2, 96, 96),
]


def mxfp4_case(name, E, H, I, gen):
    backend = vllm_mxfp4.Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_BF16
    Hp, Ip = vllm_mxfp4.mxfp4_round_up_hidden_size_and_intermediate_size(backend, H, I)
    blocks13 = torch.randint(0, 256, (E, 2 * I, H // 32, 16), generator=gen, dtype=torch.uint8)
    scales13 = torch.randint(112, 135, (E, 2 * I, H // 32), generator=gen, dtype=torch.uint8)
    bias13 = (torch.randn(E, 2 * I, generator=gen) * 2).to(torch.bfloat16)
    blocks2 = torch.randint(0, 256, (E, H, I // 32, 16), generator=gen, dtype=torch.uint8)
    scales2 = torch.randint(112, 135, (E, H, I // 32), generator=gen, dtype=torch.uint8)
    bias2 = (torch.randn(E, H, generator=gen) * 2).to(torch.bfloat16)
    # GptOssMxfp4MoEMethod.create_weights (zeros) + the gpt_oss_mxfp4 weight_loader copy.
    w13 = torch.zeros(E, 2 * Ip, Hp // 2, dtype=torch.uint8)
    w13[:, : 2 * I, : H // 2] = blocks13.reshape(E, 2 * I, H // 2)
    w13_scale = torch.zeros(E, 2 * Ip, Hp // 32, dtype=torch.uint8)
    w13_scale[:, : 2 * I, : H // 32] = scales13
    w13_bias = torch.zeros(E, 2 * Ip, dtype=torch.bfloat16)
    w13_bias[:, : 2 * I] = bias13
    w2 = torch.zeros(E, Hp, Ip // 2, dtype=torch.uint8)
    w2[:, :H, : I // 2] = blocks2.reshape(E, H, I // 2)
    w2_scale = torch.zeros(E, Hp, Ip // 32, dtype=torch.uint8)
    w2_scale[:, :H, : I // 32] = scales2
    w2_bias = torch.zeros(E, Hp, dtype=torch.bfloat16)
    w2_bias[:, :H] = bias2
    o13, o2, os13, os2, ob13, ob2 = vllm_mxfp4.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(
        mxfp4_backend=backend,
        layer=None,
        w13_weight=w13,
        w2_weight=w2,
        w13_weight_scale=w13_scale,
        w2_weight_scale=w2_scale,
        w13_bias=w13_bias,
        w2_bias=w2_bias,
        _cache_permute_indices={},
    )
    tensors = {
        "in.gate_up_blocks": blocks13,
        "in.gate_up_scales": scales13,
        "in.gate_up_bias": bias13,
        "in.down_blocks": blocks2,
        "in.down_scales": scales2,
        "in.down_bias": bias2,
        "out.w13_weight": o13,
        "out.w2_weight": o2,
        "out.w13_weight_scale": os13,
        "out.w2_weight_scale": os2,
        "out.w13_bias": ob13,
        "out.w2_bias": ob2,
    }
    save_fixture(f"mxfp4_{name}", tensors)
    return {"name": name, "experts": E, "hidden": H, "inter": I, "hidden_padded": Hp,
            "inter_padded": Ip, "backend": backend.value,
            "dtypes": {k: str(v.dtype) for k, v in tensors.items() if k.startswith("out.")}}


def main():
    gen = torch.Generator().manual_seed(26)
    cases = [mxfp4_case(*c, gen) for c in MXFP4_CASES]
    write_manifest("manifest.json", "tests/trtllm_fp4/generate.py", "mxfp4", cases)


if __name__ == "__main__":
    main()

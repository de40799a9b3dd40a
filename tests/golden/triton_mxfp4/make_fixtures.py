#!/usr/bin/env python3
"""vLLM 0.33.0's own Triton MXFP4 parameters for gpt-oss (golden fixtures for triton-mxfp4).

Runs vLLM's convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(Mxfp4MoeBackend.TRITON, ...)
(fused_moe/oracle/mxfp4.py; its _swizzle_mxfp4 from quantization/utils/mxfp4_utils.py and the
vendored triton_kernels' HopperMXValueLayout / HopperMXScaleLayout) on random gpt-oss-shaped
experts, after the padding vLLM's mxfp4_round_up_hidden_size_and_intermediate_size gives TRITON
and the copy its gpt-oss loader makes (RoutedExperts.weight_loader's gpt_oss_mxfp4 branch:
param.data[:, :rows, :cols].copy_(checkpoint), TP 1), and writes per case:

  CASE.safetensors  the source tensors under gpt-oss' names (model.layers.0.mlp.experts.
                    gate_up_proj_blocks / _scales / _bias, down_proj_*) and what vLLM holds
                    afterwards under model.layers.0.mlp.experts.routed_experts.: w13_weight /
                    w2_weight (the triton Tensors' storage, saved as its contiguous transpose:
                    .storage.data.mT), w13_weight_scale / w2_weight_scale (the PrecisionConfigs'
                    weight_scale storage, the same way), w13_bias / w2_bias (float32)
  CASE.json         versions, E / H / I / Ip, the storage views' shapes and strides, the triton
                    Tensors' logical shapes and layouts

--device cpu (default): vLLM's functions run on the CPU with the platform answering as an sm90
GPU (current_platform.is_cuda / is_device_capability(90), triton_kernels'
cuda_capability_geq(9, 0)): the layout transforms are torch reshapes and permutes, so the bytes
do not depend on the device; bench/gpu_triton_mxfp4.sh runs the same on the H100 unfaked and
compares. --device cuda: on a real GPU, nothing faked (it must be sm90).

  ~/.cache/moepack/venv-vllm-0.33.0/bin/python tests/golden/triton_mxfp4/make_fixtures.py OUTDIR
"""
import argparse
import hashlib
import json
import os
import sys

import torch

CASES = [
    # name, E, H, I, seed. Shapes matmul_ogs runs on Hopper (w13's N = 2Ip and w2's N = H above
    # 128, H % 64 == 0: docs/triton_mxfp4.md) over the padding edges (I to 64, scale groups to 4,
    # scale rows to 256), one expert and several:
    ("E2_H192_I96", 2, 192, 96, 7),
    ("E3_H256_I128", 3, 256, 128, 8),
    ("E2_H320_I224", 2, 320, 224, 9),
    ("E1_H576_I320", 1, 576, 320, 10),
    # and shapes vLLM 0.33 converts but its kernel does not run (moepack refuses them; their bytes
    # still unpack and read exactly): a value row's bytes padded to 32, N <= 128, H % 64 != 0,
    # gpt-oss-120b's H with I = 64.
    ("E2_H64_I64", 2, 64, 64, 1),
    ("E2_H96_I96", 2, 96, 96, 2),
    ("E1_H32_I32", 1, 32, 32, 3),
    ("E3_H160_I192", 3, 160, 192, 4),
    ("E2_H128_I320", 2, 128, 320, 5),
    ("E1_H2880_I64", 1, 2880, 64, 6),
]

PREFIX = "model.layers.0.mlp.experts."


def fake_sm90():
    """Make vLLM's platform and triton_kernels answer as an sm90 CUDA GPU (CPU runs only)."""
    from vllm.platforms import current_platform as p
    import triton_kernels.target_info as ti
    import triton_kernels.tensor_details.layout as layout

    p.is_cuda = lambda: True
    p.is_rocm = lambda: False
    p.is_xpu = lambda: False
    p.is_cpu = lambda: False
    p.is_device_capability = lambda cap, *a, **k: cap in (90, (9, 0))
    p.is_device_capability_family = lambda cap, *a, **k: cap == 90

    def geq(major, minor=0):
        return (9, 0) >= (major, minor)

    ti.cuda_capability_geq = geq
    layout.cuda_capability_geq = geq
    layout.is_hip_cdna4 = lambda: False


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def versions():
    import triton
    import vllm
    from vllm.utils.import_utils import get_triton_kernels_version

    root = os.path.dirname(vllm.__file__)
    files = [
        "model_executor/layers/fused_moe/oracle/mxfp4.py",
        "model_executor/layers/quantization/utils/mxfp4_utils.py",
        "model_executor/layers/quantization/mxfp4.py",
        "third_party/triton_kernels/tensor.py",
        "third_party/triton_kernels/tensor_details/layout.py",
        "third_party/triton_kernels/tensor_details/layout_details/hopper_value.py",
        "third_party/triton_kernels/tensor_details/layout_details/hopper_scale.py",
    ]
    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "triton_kernels_api": get_triton_kernels_version(),
        "sha256": {f: sha256(os.path.join(root, f)) for f in files},
    }


def random_case(E, H, I, seed):
    g = torch.Generator().manual_seed(seed)
    blocks13 = torch.randint(0, 256, (E, 2 * I, H // 32, 16), dtype=torch.uint8, generator=g)
    blocks2 = torch.randint(0, 256, (E, H, I // 32, 16), dtype=torch.uint8, generator=g)
    # E8M0 codes around 2^0, a few at the extremes (0 = 2^-127, 254 = 2^127).
    scales13 = torch.randint(110, 136, (E, 2 * I, H // 32), dtype=torch.uint8, generator=g)
    scales2 = torch.randint(110, 136, (E, H, I // 32), dtype=torch.uint8, generator=g)
    scales13.view(-1)[0] = 0
    scales2.view(-1)[-1] = 254
    bias13 = (torch.randn((E, 2 * I), generator=g) * 2).to(torch.bfloat16)
    bias2 = (torch.randn((E, H), generator=g) * 2).to(torch.bfloat16)
    return {
        PREFIX + "gate_up_proj_blocks": blocks13,
        PREFIX + "gate_up_proj_scales": scales13,
        PREFIX + "gate_up_proj_bias": bias13,
        PREFIX + "down_proj_blocks": blocks2,
        PREFIX + "down_proj_scales": scales2,
        PREFIX + "down_proj_bias": bias2,
    }


def loaded_parameters(src, E, H, I, Hp, Ip, device):
    """What create_weights + the gpt-oss loader leave (TP 1): zeros of the padded sizes, the
    checkpoint copied into the leading rows / columns, gate/up rows kept interleaved."""
    w13 = torch.zeros(E, 2 * Ip, Hp // 2, dtype=torch.uint8)
    s13 = torch.zeros(E, 2 * Ip, Hp // 32, dtype=torch.uint8)
    b13 = torch.zeros(E, 2 * Ip, dtype=torch.bfloat16)
    w2 = torch.zeros(E, Hp, Ip // 2, dtype=torch.uint8)
    s2 = torch.zeros(E, Hp, Ip // 32, dtype=torch.uint8)
    b2 = torch.zeros(E, Hp, dtype=torch.bfloat16)
    w13[:, : 2 * I, : H // 2] = src[PREFIX + "gate_up_proj_blocks"].view(E, 2 * I, H // 2)
    s13[:, : 2 * I, : H // 32] = src[PREFIX + "gate_up_proj_scales"]
    b13[:, : 2 * I] = src[PREFIX + "gate_up_proj_bias"]
    w2[:, :H, : I // 2] = src[PREFIX + "down_proj_blocks"].view(E, H, I // 2)
    s2[:, :H, : I // 32] = src[PREFIX + "down_proj_scales"]
    b2[:, :H] = src[PREFIX + "down_proj_bias"]
    return [t.to(device) for t in (w13, w2, s13, s2, b13, b2)]


def storage_bytes(t):
    """A triton_kernels Tensor's storage as the contiguous buffer it is the transpose of."""
    data = t.storage.data
    buf = data.mT
    assert buf.is_contiguous(), "storage is not the transpose of a contiguous buffer"
    return buf.detach().cpu().contiguous(), list(data.shape), list(data.stride())


def run_case(name, E, H, I, seed, device, out):
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
        Mxfp4MoeBackend,
        convert_gpt_oss_weight_to_mxfp4_moe_kernel_format,
        mxfp4_round_up_hidden_size_and_intermediate_size,
    )
    from vllm.model_executor.layers.quantization.utils.mxfp4_utils import weight_mx_scale

    backend = Mxfp4MoeBackend.TRITON
    Hp, Ip = mxfp4_round_up_hidden_size_and_intermediate_size(backend, H, I)
    src = random_case(E, H, I, seed)
    w13, w2, s13, s2, b13, b2 = loaded_parameters(src, E, H, I, Hp, Ip, device)
    layer = torch.nn.Module()
    for n, t in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", s13),
                 ("w2_weight_scale", s2)):
        layer.register_parameter(n, torch.nn.Parameter(t, requires_grad=False))
    w13_t, w2_t, pc13, pc2, bias13, bias2 = convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(
        mxfp4_backend=backend, layer=layer, w13_weight=w13, w2_weight=w2,
        w13_weight_scale=s13, w2_weight_scale=s2, w13_bias=b13, w2_bias=b2)
    tensors = {k: v.contiguous() for k, v in src.items()}
    desc = {}
    child = PREFIX + "routed_experts."
    for key, t in (("w13_weight", w13_t), ("w2_weight", w2_t),
                   ("w13_weight_scale", weight_mx_scale(pc13)),
                   ("w2_weight_scale", weight_mx_scale(pc2))):
        buf, view_shape, view_stride = storage_bytes(t)
        tensors[child + key] = buf
        desc[key] = {"dtype": str(buf.dtype), "shape": list(buf.shape),
                     "storage_view_shape": view_shape, "storage_view_stride": view_stride,
                     "logical_shape": [int(s) for s in t.shape],
                     "layout": type(t.storage.layout).__name__,
                     "layout_mx_axis": getattr(t.storage.layout, "mx_axis", None),
                     "layout_num_warps": getattr(t.storage.layout, "num_warps", None)}
    for key, t in (("w13_bias", bias13), ("w2_bias", bias2)):
        tensors[child + key] = t.detach().cpu().contiguous()
        desc[key] = {"dtype": str(t.dtype), "shape": list(t.shape)}
    from safetensors.torch import save_file

    save_file(tensors, os.path.join(out, name + ".safetensors"))
    meta = {"case": name, "experts": E, "hidden": H, "inter": I, "hidden_padded": Hp,
            "inter_padded": Ip, "seed": seed, "backend": "Mxfp4MoeBackend.TRITON",
            "device": device if device == "cpu" else torch.cuda.get_device_name(),
            "platform": "faked sm90 (CPU)" if device == "cpu" else "real",
            "versions": versions(), "outputs": desc}
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")
    print(name, "Hp", Hp, "Ip", Ip, {k: v["shape"] for k, v in desc.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    a = ap.parse_args()
    from vllm.utils.import_utils import has_triton_kernels

    assert has_triton_kernels(), "vLLM's vendored triton_kernels do not import"
    # vLLM's modules are imported on the real platform (their import-time probes), then asked.
    import vllm.model_executor.layers.fused_moe.oracle.mxfp4  # noqa: F401
    import vllm.model_executor.layers.quantization.utils.mxfp4_utils  # noqa: F401

    if a.device == "cpu":
        fake_sm90()
    else:
        assert torch.cuda.get_device_capability() == (9, 0), "needs an sm90 GPU"
    os.makedirs(a.out, exist_ok=True)
    want = set(filter(None, a.cases.split(",")))
    for c in CASES:
        if not want or c[0] in want:
            run_case(*c, a.device, a.out)


if __name__ == "__main__":
    sys.exit(main())

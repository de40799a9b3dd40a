"""What the producers of tests/trtllm_fp4/fixtures/ share (generate.py: gpt-oss MXFP4,
generate_nvfp4.py: NVFP4 W4A4): FlashInfer 0.7.2.post1's block-scale interleave on the CPU, and
writing the fixtures and their manifest.

FlashInfer: its row indices are plain torch; nvfp4_block_scale_interleave's Python wrapper asks
the CUDA device for its arch, so importing this module points it (flashinfer.fp4_quantization's
and flashinfer's own name) at the op it wraps, block_scale_interleave_sm100 of the
fp4_quantization_100 JIT module (built here for sm100, FLASHINFER_CUDA_ARCH_LIST=10.0a, no GPU),
whose host path takes CPU tensors (csrc/nv_internal/tensorrt_llm/thop/fp4Op.cpp
blockScaleInterleaveHost). Import it before vLLM, so that vLLM's modules see the CPU op.
Nothing here runs at test time.
"""
import importlib.metadata as md
import json
import os

os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "10.0a")

from safetensors.torch import save_file  # noqa: E402

import flashinfer  # noqa: E402
import flashinfer.fp4_quantization as fi_fp4  # noqa: E402
from flashinfer.quantization.fp4_quantization import get_fp4_quantization_module  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

_module = get_fp4_quantization_module("100")


def block_scale_interleave_cpu(unswizzled_sf):
    assert unswizzled_sf.device.type == "cpu"
    return _module.block_scale_interleave_sm100(unswizzled_sf.contiguous())


fi_fp4.nvfp4_block_scale_interleave = block_scale_interleave_cpu
flashinfer.nvfp4_block_scale_interleave = block_scale_interleave_cpu


def save_fixture(name, tensors):
    """fixtures/<name>.safetensors: `tensors` (name -> torch tensor), contiguous, mode 0644."""
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"{name}.safetensors")
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)
    os.chmod(path, 0o644)


def write_manifest(file_name, producer, cases_key, cases):
    """fixtures/<file_name>: the producer, the vLLM / FlashInfer / torch versions, how the
    interleave ran, and `cases` under `cases_key`; prints the versions."""
    manifest = {
        "producer": producer,
        "versions": {p: md.version(p) for p in ("vllm", "flashinfer-python", "torch")},
        "flashinfer_block_scale_interleave": "fp4_quantization_100 JIT module, host path",
        cases_key: cases,
    }
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, file_name), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    print(json.dumps(manifest["versions"]))

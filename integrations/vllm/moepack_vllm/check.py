"""`moepack-vllm check DIR`: whether this moepack-vllm serves a moepack artifact, without vLLM.

Runs the refusals the plugin runs before a model is built, on the same code (artifact.py):
config.json's quantization_config, then moepack.json (its SHA-256 against config.json, its
agreement with config.json, its serving path), then the deployment (--tensor-parallel-size,
--enable-expert-parallel, --dtype). Exit 0: served (one line on stdout saying how); 4: not (the
plugin's refusal on stderr); 2: usage. Imports neither vLLM nor torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .artifact import ArtifactError, Block, read_manifest

# The kernel builders moe.py registers (moe.KERNEL_BUILDERS), by name: moe.py imports vLLM.
KERNEL_BUILDER_NAMES = ("wna16-marlin", "wna16-humming", "marlin-float", "gpt-oss-triton",
                        "gpt-oss-trtllm")
_DTYPES = {"BF16": "bfloat16", "F16": "float16"}


def check(model_dir: str, tensor_parallel_size: int = 1, expert_parallel: bool = False,
          dtype: str | None = None) -> str:
    """How the artifact is served; raises ArtifactError with the plugin's refusal when not."""
    path = os.path.join(model_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ArtifactError(f"{path}: cannot read: {e}") from e
    q = config.get("quantization_config") if isinstance(config, dict) else None
    if not isinstance(q, dict) or q.get("quant_method") != "moepack":
        raise ArtifactError(f"{path}: quantization_config.quant_method is not \"moepack\": "
                            "not a moepack artifact")
    block = Block.parse(q, path)
    manifest = read_manifest(model_dir, block)
    manifest.check_servable(KERNEL_BUILDER_NAMES, block.source_quantization_config is not None)
    block.check_deployment(tensor_parallel_size=tensor_parallel_size,
                           expert_parallel=expert_parallel,
                           dtype_name=dtype or _DTYPES.get(block.act_dtype, ""), file=path)
    s = manifest.serving
    how = (f"vLLM's {s.vllm_method} ({s.vllm_backend})" if s.path == "vllm-method"
           else f"the {s.kernel_builder} kernel builder")
    if manifest.parallel is not None and manifest.parallel.expert > 1:
        degree = (f"expert parallelism over {manifest.parallel.expert} ranks "
                  f"({manifest.parallel.placement} placement; --tensor-parallel-size "
                  f"{manifest.parallel.expert} --enable-expert-parallel), each rank reading its "
                  "own expert files")
    elif manifest.parallel is not None:
        degree = (f"tensor_parallel_size {block.tensor_parallel_size}, no expert parallelism, "
                  "each rank reading its own expert files")
    else:
        degree = f"tensor_parallel_size {block.tensor_parallel_size}, no expert parallelism"
    return (f"servable by moepack-vllm in vLLM {block.vllm_target}: backend {block.backend}, "
            f"{how}, {degree}, on {', '.join(s.archs) or 'any arch'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="moepack-vllm",
                                description="moepack-vllm tools (no vLLM import)")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="say whether this moepack-vllm serves a moepack artifact")
    c.add_argument("dir", help="the converted checkpoint (moepack convert's DST)")
    c.add_argument("--tensor-parallel-size", type=int, default=1)
    c.add_argument("--enable-expert-parallel", action="store_true")
    c.add_argument("--dtype", choices=sorted(_DTYPES.values()),
                   help="the engine's dtype (default: the artifact's act_dtype)")
    t = sub.add_parser("seed-tuning", help="store humming's tuning tables for a named GPU in a "
                                           "moepack `humming` artifact (computed on the CPU)")
    t.add_argument("dir", help="the converted checkpoint (a `humming` artifact)")
    t.add_argument("--gpu", default=None, help="h100-sxm (default: the artifact's target arch's)")
    a = p.parse_args(argv)
    if a.command == "seed-tuning":  # imports humming (not vLLM): humming_tuning.py
        from . import humming_tuning

        humming_tuning.seed(Path(a.dir), a.gpu)
        return 0
    try:
        print(check(a.dir, a.tensor_parallel_size, a.enable_expert_parallel, a.dtype))
    except ArtifactError as e:
        print(f"moepack-vllm: NOT servable: {e}", file=sys.stderr)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())

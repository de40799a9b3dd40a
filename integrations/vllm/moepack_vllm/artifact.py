"""What a moepack artifact is, read from its config block and moepack.json, and what this plugin
can serve of it. No vLLM import here: the refusals are testable without an engine.

Every refusal raises ArtifactError with a message naming the file and field, so a user sees why
the artifact cannot be served instead of a model that talks nonsense.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

# The vLLM release line whose names and shapes the artifact must have been written for.
VLLM_TARGETS = ("0.33",)

# backend -> layout versions this plugin serves. Everything else is refused with a reason
# (docs/vllm.md "What is served").
# Marlin layout 2 (issue 10) differs from 1 only for act-order layers (refused here) and adds the
# 0.33 intermediate padding (whole tiles the kernel reads as it is; docs/vllm_targets.md).
SERVED_LAYOUTS = {"marlin": (1, 2)}
UNSERVED_REASONS = {
    "triton-wna16": "vLLM 0.33's MoeWNA16 method reads the checkpoint-format qweight/scales and "
    "repacks them itself; its Triton kernel has no pre-packed entry point this plugin can feed",
    "triton-int8": "vLLM 0.33's W8A8 int8 MoE methods quantise per load and have no pre-processed "
    "weight path this plugin can feed",
    "trtllm-mxfp8": "the TRT-LLM MXFP8 MoE path needs FlashInfer's sm100 kernels; not served by "
    "this plugin yet",
    "trtllm-fp8-block": "the TRT-LLM FP8 block MoE path needs FlashInfer's sm100 kernels; not "
    "served by this plugin yet",
}
# Source methods whose Marlin parameters the plugin knows by name.
MARLIN_SOURCES = ("gptq", "awq", "compressed-tensors-pack-quantized")


class ArtifactError(ValueError):
    """The artifact cannot be served here (wrong config, manifest, target or deployment)."""


def _field(block: dict, key: str, file: str, types):
    if key not in block:
        raise ArtifactError(f"{file}: quantization_config.{key} is missing (not a moepack block?)")
    value = block[key]
    if not isinstance(value, types) or isinstance(value, bool) and types is not bool:
        raise ArtifactError(f"{file}: quantization_config.{key}: unexpected value {value!r}")
    return value


@dataclass
class Block:
    """config.json's quantization_config of a moepack output."""

    backend: str
    layout: str
    layout_version: int
    target_arch: str
    act_dtype: str
    vllm_target: str
    tensor_parallel_size: int
    manifest: str
    manifest_sha256: str
    source_format: str
    source_quantization_config: dict | None
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def parse(cls, block: dict, file: str = "config.json") -> "Block":
        if not isinstance(block, dict) or block.get("quant_method") != "moepack":
            raise ArtifactError(f"{file}: quantization_config.quant_method is not \"moepack\"")
        b = cls(
            backend=_field(block, "backend", file, str),
            layout=_field(block, "layout", file, str),
            layout_version=_field(block, "layout_version", file, int),
            target_arch=_field(block, "target_arch", file, str),
            act_dtype=_field(block, "act_dtype", file, str),
            # Written by every moepack that writes quant_method "moepack"; the 0.33 names are
            # the only ones such a moepack wrote before --vllm-target existed.
            vllm_target=block.get("vllm_target", "0.33"),
            tensor_parallel_size=_field(block, "tensor_parallel_size", file, int),
            manifest=_field(block, "manifest", file, str),
            manifest_sha256=_field(block, "manifest_sha256", file, str),
            source_format=_field(block, "source_format", file, str),
            source_quantization_config=block.get("source_quantization_config"),
            raw=block,
        )
        b.check_servable(file)
        return b

    def check_servable(self, file: str = "config.json") -> None:
        if self.backend not in SERVED_LAYOUTS:
            why = UNSERVED_REASONS.get(self.backend, "unknown backend")
            raise ArtifactError(
                f"{file}: quantization_config.backend {self.backend!r} is not served by "
                f"moepack-vllm: {why}")
        if self.layout_version not in SERVED_LAYOUTS[self.backend]:
            raise ArtifactError(
                f"{file}: quantization_config.layout_version {self.layout_version} of "
                f"{self.backend!r}: this moepack-vllm serves versions "
                f"{list(SERVED_LAYOUTS[self.backend])}; upgrade moepack-vllm or re-convert")
        if self.vllm_target not in VLLM_TARGETS:
            raise ArtifactError(
                f"{file}: quantization_config.vllm_target {self.vllm_target!r}: the artifact was "
                f"written for another vLLM line; this moepack-vllm serves {list(VLLM_TARGETS)} "
                "(re-convert with the matching --vllm-target)")
        if self.act_dtype not in ("BF16", "F16"):
            raise ArtifactError(f"{file}: quantization_config.act_dtype {self.act_dtype!r}")
        if self.source_format not in MARLIN_SOURCES:
            raise ArtifactError(
                f"{file}: quantization_config.source_format {self.source_format!r} has no Marlin "
                "MoE parameters in vLLM 0.33 (served: gptq, awq, compressed-tensors-pack-quantized)")
        if len(self.manifest_sha256) != 64:
            raise ArtifactError(f"{file}: quantization_config.manifest_sha256 is not a SHA-256")

    def check_deployment(self, tensor_parallel_size: int, expert_parallel: bool,
                         device_capability: int | None, dtype_name: str) -> None:
        """Refuses a deployment the artifact was not written for."""
        if tensor_parallel_size != self.tensor_parallel_size:
            raise ArtifactError(
                f"moepack artifact was written for tensor_parallel_size="
                f"{self.tensor_parallel_size}, the engine runs {tensor_parallel_size}: the expert "
                "tensors are laid out for whole (unsplit) experts; serve it with "
                f"--tensor-parallel-size {self.tensor_parallel_size}")
        if expert_parallel:
            raise ArtifactError("moepack artifact holds every expert in one tensor per layer; "
                                "expert parallelism is not supported")
        # Marlin's tiles are the same for every arch the kernel runs on (sm80+); the target arch
        # only chose the backend. Refuse devices the kernel cannot run on.
        if device_capability is not None and device_capability < 80:
            raise ArtifactError(
                f"moepack {self.backend} artifact (target {self.target_arch}) needs an sm80+ GPU; "
                f"this one is sm{device_capability}")
        want = {"BF16": "bfloat16", "F16": "float16"}[self.act_dtype]
        if dtype_name != want:
            raise ArtifactError(
                f"moepack artifact stores its scales in {want} (act_dtype {self.act_dtype}); the "
                f"engine runs {dtype_name}: serve it with --dtype {want} or re-convert with "
                "--act-dtype")


@dataclass
class Layer:
    module: str
    param_prefix: str
    experts: int
    hidden: int
    inter: int
    gated: bool
    params: dict  # local name ("w13_qweight") -> (dtype name, shape)


@dataclass
class Manifest:
    path: str
    source_method: str
    bits: int
    group_size: int
    symmetric: bool
    layers: list

    def layer_for(self, prefix: str) -> Layer | None:
        """The manifest layer served by vLLM's MoE module at `prefix`.

        vLLM names the module `<module>.experts` (and its RoutedExperts child
        `<module>.experts.routed_experts`); the manifest names the source's MoE block."""
        for L in self.layers:
            if prefix == L.module + ".experts" or prefix.startswith(L.module + ".experts."):
                return L
        return None


def read_manifest(model_dir: str, block: Block) -> Manifest:
    """Reads DIR/moepack.json, checking it is the one config.json names (by SHA-256)."""
    path = os.path.join(model_dir, block.manifest)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read the moepack manifest: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != block.manifest_sha256:
        raise ArtifactError(
            f"{path}: SHA-256 {digest} differs from config.json's "
            f"quantization_config.manifest_sha256 {block.manifest_sha256}: the manifest and the "
            "config are not from the same conversion")
    try:
        m = json.loads(data)
        tq = m["target_quant_params"]
        tensors = m["tensors"]
        layers = []
        for i, L in enumerate(m["layers"]):
            prefix = L["param_prefix"]
            params = {}
            for name in L["params"]:
                t = tensors[name]
                if not name.startswith(prefix):
                    raise ArtifactError(f"{path}: layers[{i}].params: {name} is not under {prefix}")
                params[name[len(prefix):]] = (t["dtype"], tuple(t["shape"]))
            layers.append(Layer(L["module"], prefix, L["experts"], L["hidden"], L["inter"],
                                L["gated"], params))
        return Manifest(path, tq["method"], tq["bits"], tq["group_size"], tq["symmetric"], layers)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, ArtifactError):
            raise
        raise ArtifactError(f"{path}: malformed moepack manifest ({e!r})") from e

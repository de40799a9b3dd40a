"""The "moepack" quantization method: claims exactly the checkpoints whose config says so."""

from __future__ import annotations

from typing import Any

import torch

from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.quantization import (
    get_quantization_config,
    register_quantization_config,
)
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)

from .artifact import ArtifactError, Block, Manifest, read_manifest

# vLLM's name for the source method whose config class reads the nested block. These are the
# methods vLLM's own override detection picks on CUDA for the same quant_method.
_SOURCE_METHOD = {"gptq": "auto_gptq", "awq": "auto_awq",
                  "compressed-tensors": "compressed-tensors"}


@register_quantization_config("moepack")
class MoepackConfig(QuantizationConfig):
    """A moepack artifact: experts in kernel layout, every other Linear as the source wrote it."""

    def __init__(self, block: Block, source: QuantizationConfig | None) -> None:
        super().__init__()
        self.block = block
        self.source = source  # the source's own method, for the copied-through Linears
        self._manifest: Manifest | None = None

    def __repr__(self) -> str:
        return (f"MoepackConfig(backend={self.block.backend}, layout={self.block.layout} "
                f"v{self.block.layout_version}, source={self.block.source_format})")

    @classmethod
    def get_name(cls) -> str:
        return "moepack"

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80  # Marlin

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "MoepackConfig":
        block = Block.parse(config)
        src = block.source_quantization_config
        source = None
        if src is not None:
            method = str(src.get("quant_method", "")).lower()
            if method not in _SOURCE_METHOD:
                raise ArtifactError(
                    "config.json: quantization_config.source_quantization_config.quant_method "
                    f"{method!r} has no vLLM method this plugin delegates to")
            source = get_quantization_config(_SOURCE_METHOD[method]).from_config(src)
        return cls(block, source)

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        if not isinstance(hf_quant_cfg, dict) or hf_quant_cfg.get("quant_method") != "moepack":
            return None
        if user_quant not in (None, "moepack"):
            raise ArtifactError(
                f"this is a moepack artifact (quant_method \"moepack\"); --quantization "
                f"{user_quant} would read its kernel-format experts as {user_quant} tensors")
        return "moepack"

    def manifest(self) -> Manifest:
        """moepack.json of the served model, digest-checked against config.json (read once)."""
        if self._manifest is None:
            from vllm.config import get_current_vllm_config

            vc = get_current_vllm_config()
            mc = vc.model_config
            pc = vc.parallel_config
            cap = None
            from vllm.platforms import current_platform

            if current_platform.is_cuda():
                c = current_platform.get_device_capability()
                cap = c.to_int() if c is not None else None
            self.block.check_deployment(
                tensor_parallel_size=pc.tensor_parallel_size,
                expert_parallel=bool(getattr(pc, "enable_expert_parallel", False)),
                device_capability=cap,
                dtype_name=str(mc.dtype).removeprefix("torch."))
            self._manifest = read_manifest(mc.model, self.block)
        return self._manifest

    def get_quant_method(self, layer: torch.nn.Module,
                         prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, RoutedExperts):
            from .moe import MoepackMarlinMoEMethod

            m = self.manifest()
            L = m.layer_for(prefix)
            if L is None:
                raise ArtifactError(
                    f"{m.path}: vLLM's MoE layer {prefix!r} has no entry in the manifest "
                    f"(layers: {[x.module for x in m.layers][:4]}...)")
            return MoepackMarlinMoEMethod(layer.moe_config, m, L, prefix)
        if self.source is None:
            return None
        self.source.packed_modules_mapping = self.packed_modules_mapping
        return self.source.get_quant_method(layer, prefix)

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        if self.source is not None:
            self.source.apply_vllm_mapper(hf_to_vllm_mapper)

    def maybe_update_config(self, model_name: str, hf_config=None, revision=None):
        if self.source is not None and hasattr(self.source, "maybe_update_config"):
            self.source.maybe_update_config(model_name, hf_config=hf_config, revision=revision)

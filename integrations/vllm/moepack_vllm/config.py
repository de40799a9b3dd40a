"""The "moepack" quantization method: claims exactly the checkpoints whose config says so."""

from __future__ import annotations

from typing import Any

import torch

from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.quantization import (
    QUANTIZATION_METHODS,
    get_quantization_config,
    register_quantization_config,
)
from vllm.model_executor.layers.quantization.base_config import (
    QuantizationConfig,
    QuantizeMethodBase,
)

from .artifact import ArtifactError, Block, Manifest, check_capability, read_manifest


def _vllm_method_for(method: str, src: dict) -> str:
    """The vLLM config class vLLM itself picks for a source block: ModelOpt checkpoints all say
    `quant_method: modelopt`, and vLLM's ModelConfig picks modelopt / modelopt_fp4 /
    modelopt_mxfp8 / modelopt_mixed by their override_quantization_method (on quant_algo)."""
    if method != "modelopt":
        return method
    for name in ("modelopt", "modelopt_fp4", "modelopt_mxfp8", "modelopt_mixed"):
        if name in QUANTIZATION_METHODS:
            picked = get_quantization_config(name).override_quantization_method(src, None)
            if picked is not None:
                return picked
    return method


@register_quantization_config("moepack")
class MoepackConfig(QuantizationConfig):
    """A moepack artifact: experts in kernel layout, every other Linear as the source wrote it."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.block = block
        self._manifest: Manifest | None = None
        self._deployment_checked = False
        self._source: QuantizationConfig | None = None
        self._rank: tuple[int, Manifest] | None = None  # (rank, its manifest): parallel artifacts

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
        # The lowest any layout's kernel runs on (Marlin); each artifact's own minimum comes from
        # its manifest (serving.archs) and is checked in manifest().
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "MoepackConfig":
        return cls(Block.parse(config))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        if not isinstance(hf_quant_cfg, dict) or hf_quant_cfg.get("quant_method") != "moepack":
            return None
        if user_quant not in (None, "moepack"):
            raise ArtifactError(
                f"this is a moepack artifact (quant_method \"moepack\"); --quantization "
                f"{user_quant} would read its kernel-format experts as {user_quant} tensors")
        return "moepack"

    # ---- the manifest and the source's own method ----

    def _load_manifest(self, model_dir: str) -> Manifest:
        """moepack.json of `model_dir`: digest-checked, matching config.json, servable (once)."""
        if self._manifest is None:
            from .moe import KERNEL_BUILDERS

            m = read_manifest(model_dir, self.block)
            m.check_servable(KERNEL_BUILDERS, self.block.source_quantization_config is not None)
            self._manifest = m
        return self._manifest

    def maybe_update_config(self, model_name: str, hf_config=None, revision=None):
        # vLLM calls this while building its config, with the model directory: an artifact that
        # is not served here is refused before any model is built. A tensor- or expert-parallel
        # artifact is judged by its degree first (check_deployment, once the engine's parallel
        # config is current: manifest()), then its manifest is read, and each rank's share is
        # checked when the rank's MoE layers are built (_rank_manifest).
        if not self.block.is_parallel:
            self._load_manifest(model_name)
        if self.source is not None and hasattr(self.source, "maybe_update_config"):
            self.source.maybe_update_config(model_name, hf_config=hf_config, revision=revision)

    @property
    def source(self) -> QuantizationConfig | None:
        """vLLM's config for the source's block (null: unquantized), for the copied-through
        Linears and, on the vllm-method path, the MoE method itself."""
        src = self.block.source_quantization_config
        if self._source is None and src is not None:
            method = str(src.get("quant_method", ""))
            if method not in QUANTIZATION_METHODS:
                raise ArtifactError(
                    "config.json: quantization_config.source_quantization_config.quant_method "
                    f"{method!r} is not a vLLM quantization method")
            self._source = get_quantization_config(_vllm_method_for(method, src)).from_config(src)
        return self._source

    def manifest(self) -> Manifest:
        """The served model's manifest, after checking the deployment against it (once)."""
        from vllm.config import get_current_vllm_config
        from vllm.platforms import current_platform

        vc = get_current_vllm_config()
        if not self._deployment_checked:
            # config.json's block first: a tensor- or expert-parallel artifact at another degree
            # is refused naming both before any layer is built.
            pc = vc.parallel_config
            self.block.check_deployment(
                tensor_parallel_size=pc.tensor_parallel_size,
                expert_parallel=bool(getattr(pc, "enable_expert_parallel", False)),
                dtype_name=str(vc.model_config.dtype).removeprefix("torch."))
        m = self._load_manifest(vc.model_config.model)
        if not self._deployment_checked:
            cap = None
            if current_platform.is_cuda():
                c = current_platform.get_device_capability()
                cap = c.to_int() if c is not None else None
            check_capability(m, cap)
            self._deployment_checked = True
        return m

    def get_quant_method(self, layer: torch.nn.Module,
                         prefix: str) -> QuantizeMethodBase | None:
        if isinstance(layer, RoutedExperts):
            from .moe import MoepackMoEMethod

            m = self._rank_manifest(layer, self.manifest())
            L = m.layer_for(prefix)
            if L is None:
                raise ArtifactError(
                    f"{m.path}: vLLM's MoE layer {prefix!r} has no entry in the manifest "
                    f"(layers: {[x.module for x in m.layers][:4]}...)")
            return MoepackMoEMethod(layer, m, L, prefix, self.source_for_moe())
        if self.source is None:
            return None
        self.source.packed_modules_mapping = self.packed_modules_mapping
        return self.source.get_quant_method(layer, prefix)

    def _rank_manifest(self, layer: RoutedExperts, m: Manifest) -> Manifest:
        """A parallel artifact as this process's rank serves it: the rank is the MoE layer's own
        (vLLM's FusedMoEParallelConfig: tp_rank for tensor parallel, ep_rank for expert
        parallel), the layer's degree must be the artifact's, and under expert parallelism the
        experts vLLM's expert map puts on this rank must be the ones the rank's tensors hold
        (vLLM falls back from round_robin to linear placement for models without expert groups).
        Whole-expert artifacts are served as they are."""
        p = m.parallel
        if p is None:
            return m
        mpc = layer.moe_config.moe_parallel_config
        tp, ep = (mpc.tp_size, mpc.ep_size) if mpc.use_ep else (mpc.tp_size, 1)
        if (tp, ep) != (p.tensor, p.expert):
            engine = (f"expert parallelism over {ep} ranks" if ep > 1
                      else f"MoE tensor_parallel_size={tp}")
            raise ArtifactError(
                f"{m.path}: parallel: moepack artifact was written for {p.describe()}, vLLM "
                f"runs this MoE layer with {engine} (its FusedMoEParallelConfig): re-convert for "
                "that deployment")
        rank = mpc.ep_rank if p.expert > 1 else mpc.tp_rank
        if self._rank is not None and self._rank[0] != rank:
            raise ArtifactError(f"{m.path}: MoE layers of one process on ranks {self._rank[0]} "
                                f"and {rank}")
        if self._rank is None:
            self._rank = (rank, m.for_rank(rank))
        mine = self._rank[1]
        if p.expert > 1:
            emap = getattr(layer, "_expert_map", None)
            held = () if emap is None else tuple(
                int(g) for g in sorted(range(emap.numel()), key=lambda g: int(emap[g]))
                if int(emap[g]) >= 0)
            want = p.ranks[rank].experts
            placed = getattr(layer, "expert_placement_strategy", "?")
            if held != want:
                raise ArtifactError(
                    f"{m.path}: parallel.ranks[{rank}].experts: the artifact's rank {rank} holds "
                    f"experts {list(want)} ({p.placement} placement), vLLM's expert map puts "
                    f"{list(held)} on it (placement {placed!r}): "
                    f"serve it with --expert-placement-strategy {p.placement} where vLLM keeps "
                    "that placement, or re-convert with --expert-placement linear")
        return mine

    def source_for_moe(self) -> QuantizationConfig | None:
        if self.source is not None:
            self.source.packed_modules_mapping = self.packed_modules_mapping
        return self.source

    def apply_vllm_mapper(self, hf_to_vllm_mapper) -> None:
        if self.source is not None:
            self.source.apply_vllm_mapper(hf_to_vllm_mapper)

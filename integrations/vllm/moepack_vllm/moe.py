"""The MoE method of a moepack artifact: parameters in the kernel's names and shapes, loaded
byte for byte, and a post-processing step that only builds the kernel object.

Which kernel: the one the artifact was written for (Marlin), forced, whatever vLLM's WNA16
oracle would pick (on SM90 vLLM 0.33 prefers Humming, which reads another layout).
"""

from __future__ import annotations

import torch

from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import (
    WNA16MoEBackend,
    make_wna16_moe_kernel,
    make_wna16_moe_quant_config,
)
from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts

from .artifact import ArtifactError, Layer, Manifest

_DTYPES = {"I32": torch.int32, "BF16": torch.bfloat16, "F16": torch.float16,
           "F32": torch.float32, "U8": torch.uint8, "I8": torch.int8, "I64": torch.int64}

# Per source method: the artifact's names of (w13 weight, w2 weight, w13 scales, w2 scales,
# w13 zeros, w2 zeros, act-order params). docs/marlin.md "Parameters".
_MARLIN_NAMES = {
    "gptq": ("w13_qweight", "w2_qweight", "w13_scales", "w2_scales", None, None,
             ("w13_g_idx", "w2_g_idx", "w13_g_idx_sort_indices", "w2_g_idx_sort_indices")),
    "awq": ("w13_qweight", "w2_qweight", "w13_scales", "w2_scales", "w13_qzeros", "w2_qzeros",
            ("w13_g_idx_sort_indices", "w2_g_idx_sort_indices")),
    "compressed-tensors-pack-quantized": (
        "w13_weight_packed", "w2_weight_packed", "w13_weight_scale", "w2_weight_scale", None,
        None, ("w13_weight_g_idx", "w2_weight_g_idx", "w13_g_idx_sort_indices",
               "w2_g_idx_sort_indices")),
}


class MoepackMarlinMoEMethod(FusedMoEMethodBase):
    """Serves one MoE layer of a moepack Marlin artifact."""

    supports_pre_processed_weights = True

    def __init__(self, moe, manifest: Manifest, layer: Layer, prefix: str) -> None:
        super().__init__(moe)
        self.manifest = manifest
        self.art = layer
        self.prefix = prefix
        self.names = _MARLIN_NAMES[manifest.source_method]
        self.loaded: set[str] = set()
        self.use_marlin = True
        self.experts_cls = MarlinExperts
        self.backend = WNA16MoEBackend.MARLIN

    # ---- parameters ----

    def create_weights(self, layer: RoutedExperts, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs) -> None:
        L = self.art
        where = f"{self.manifest.path}: layer {L.module}"
        got = (num_experts, hidden_size, intermediate_size_per_partition)
        if got != (L.experts, L.hidden, L.inter):
            raise ArtifactError(
                f"{where}: written for (experts, hidden, intermediate) = "
                f"{(L.experts, L.hidden, L.inter)}, vLLM builds {got} for {self.prefix}")
        for name in self.names[6]:
            if name in L.params and L.params[name][1][-1] != 0:
                raise ArtifactError(
                    f"{where}: {name} {list(L.params[name][1])}: act-order layers are not served "
                    "(vLLM 0.33's Marlin MoE kernel takes no g_idx/perm)")
        for local, (dtype, shape) in L.params.items():
            if dtype not in _DTYPES:
                raise ArtifactError(f"{where}: {local}: dtype {dtype} not served")
            if (dtype in ("BF16", "F16")) and _DTYPES[dtype] != params_dtype:
                raise ArtifactError(
                    f"{where}: {local} is {dtype}, the engine's dtype is {params_dtype}")
            p = torch.nn.Parameter(torch.empty(shape, dtype=_DTYPES[dtype]), requires_grad=False)
            p.weight_loader = self._make_loader(local)
            layer.register_parameter(local, p)
        for local in self.names[:4]:
            if local not in L.params:
                raise ArtifactError(f"{where}: the manifest lists no {L.param_prefix}{local}")

    def _make_loader(self, local: str):
        def load(param: torch.nn.Parameter, loaded_weight: torch.Tensor, *args, **kwargs):
            self.copy_into(local, param, loaded_weight)
        return load

    def copy_into(self, local: str, param: torch.Tensor, w: torch.Tensor) -> None:
        where = f"{self.prefix}: {local}"
        if w.dtype != param.dtype or tuple(w.shape) != tuple(param.shape):
            raise ArtifactError(
                f"{where}: checkpoint tensor is {w.dtype} {list(w.shape)}, the artifact's "
                f"manifest says {param.dtype} {list(param.shape)}")
        param.data.copy_(w)
        self.loaded.add(local)

    def load_layer_weights(self, layer: RoutedExperts, weights):
        """RoutedExperts.load_weights for a moepack layer: names relative to the MoE runner,
        `routed_experts.<param>` (vLLM 0.33) or `<param>` (legacy)."""
        for name, w in weights:
            local = name.removeprefix("routed_experts.")
            if local not in self.art.params:
                raise ArtifactError(
                    f"{self.prefix}: checkpoint tensor {local!r} is not a parameter of this "
                    f"moepack layer (expected {sorted(self.art.params)})")
            self.copy_into(local, getattr(layer, local), w)
            yield local

    # ---- after loading: no tensor transform, only the kernel object ----

    def process_weights_after_loading(self, layer: RoutedExperts) -> None:
        missing = sorted(set(self.art.params) - self.loaded)
        if missing:
            raise ArtifactError(
                f"{self.manifest.path}: layer {self.art.module}: the checkpoint holds no "
                f"{', '.join(self.art.param_prefix + m for m in missing)}")
        w13, w2, s13, s2, z13, z2, _ = self.names
        # The modular kernel reads w13_weight/w2_weight.
        layer.w13_weight = getattr(layer, w13)
        layer.w2_weight = getattr(layer, w2)
        self.moe_quant_config = self.get_fused_moe_quant_config(layer)
        self.moe_kernel = make_wna16_moe_kernel(
            moe_quant_config=self.moe_quant_config,
            moe_config=self.moe,
            experts_cls=self.experts_cls,
            backend=self.backend,
            routing_tables=layer._expert_routing_tables(),
        )

    def get_fused_moe_quant_config(self, layer: RoutedExperts):
        w13, w2, s13, s2, z13, z2, _ = self.names
        m = self.manifest
        return make_wna16_moe_quant_config(
            w1_scale=getattr(layer, s13),
            w2_scale=getattr(layer, s2),
            group_size=m.group_size,
            num_bits=m.bits,
            w1_zp=getattr(layer, z13) if z13 else None,
            w2_zp=getattr(layer, z2) if z2 else None,
        )

    def apply(self, layer: RoutedExperts, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, shared_experts, shared_experts_input):
        assert self.moe_kernel is not None
        return self.moe_kernel.apply(
            hidden_states=x,
            w1=layer.w13_weight,
            w2=layer.w2_weight,
            topk_weights=topk_weights,
            topk_ids=topk_ids,
            activation=layer.activation,
            global_num_experts=layer.global_num_experts,
            apply_router_weight_on_input=layer.apply_router_weight_on_input,
            expert_map=layer.expert_map,
            shared_experts=shared_experts,
            shared_experts_input=shared_experts_input,
        )


def patch_routed_experts_loader() -> None:
    """vLLM's RoutedExperts.load_weights matches checkpoint names against per-expert names
    (`experts.0.gate_proj.`) and silently skips whole-layer kernel tensors. For layers served by
    the moepack method it loads them by name instead; other layers keep vLLM's loader."""
    original = RoutedExperts.load_weights
    if getattr(original, "_moepack", False):
        return

    def load_weights(self, weights):
        if isinstance(self.quant_method, MoepackMarlinMoEMethod):
            return self.quant_method.load_layer_weights(self, weights)
        return original(self, weights)

    load_weights._moepack = True
    RoutedExperts.load_weights = load_weights

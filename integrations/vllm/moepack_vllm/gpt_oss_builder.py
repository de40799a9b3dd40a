"""gpt-oss MXFP4 served by vLLM 0.33's own GptOssMxfp4MoEMethod, minus its conversion.

vLLM's method does not declare supports_pre_processed_weights (docs/gpt-oss.md), so path (a)
cannot take these artifacts; but everything of the method except the conversion runs as written
(docs/vllm.md "Serving paths", builders `gpt-oss-triton` and `gpt-oss-trtllm`):

1. its constructor's oracle (`select_mxfp4_moe_backend`) picks the backend for the GPU found; the
   artifact is refused unless that is the backend it was written for (the plugin never serves a
   layout stock vLLM would not run there);
2. `maybe_roundup_sizes` is vLLM's own (`mxfp4_round_up_hidden_size_and_intermediate_size`);
3. its `create_weights` runs on the meta device (setting what its post-processing reads) and must
   register exactly the manifest's parameter names, which are then loaded byte for byte;
4. in place of `convert_gpt_oss_weight_to_mxfp4_moe_kernel_format` (moepack ran it ahead of time)
   the layer is left as that function leaves it: for TRITON the swizzled buffers wrapped into the
   triton_kernels Tensors and PrecisionConfigs (`triton_mxfp4.wrap_triton_mxfp4`; the weight and
   scale parameters removed, the Tensors set on the layer and the method, as vLLM's
   `_setup_kernel` sets them); for FLASHINFER_TRTLLM_MXFP4_BF16 the parameters as they are
   (FlashInfer's shuffled weights, 128x4-interleaved E8M0 scales viewed as float8_e4m3fn, float32
   biases: what `replace_parameter` leaves);
5. then the rest of vLLM's `_setup_kernel`: the method's `get_fused_moe_quant_config` (biases,
   swigluoai's alpha 1.702, beta 1.0, limit 7.0), `make_mxfp4_moe_kernel` with the experts class
   its oracle chose, and the experts' `process_weights_after_loading`; the layer then runs
   through the method's own `apply_monolithic` / `apply`.
"""

from __future__ import annotations

from .artifact import ArtifactError

GPT_OSS = "gpt-oss-mxfp4"

# What vLLM 0.33 runs for gpt-oss, by Mxfp4MoeBackend, as moepack's layout and convert flags:
# the layout to convert to where the oracle picks another backend than the artifact's.
MOEPACK_LAYOUT_FOR_BACKEND = {
    "TRITON": "triton-mxfp4 (moepack convert --target-arch sm90)",
    "FLASHINFER_TRTLLM_MXFP4_BF16": "trtllm-mxfp4 (moepack convert --target-arch sm100)",
    "MARLIN": "marlin-mxfp4 (moepack convert --target-arch sm80, sm86, sm89 or sm120)",
}

# Every role the layer's parameters carry, and their dtypes per builder.
_ROLES = ("w13_weight", "w2_weight", "w13_scale", "w2_scale", "w13_bias", "w2_bias")


def conversion_hint(backend_name: str) -> str:
    """Where to convert a gpt-oss checkpoint for a GPU on which vLLM runs `backend_name`."""
    layout = MOEPACK_LAYOUT_FOR_BACKEND.get(backend_name)
    if layout is None:
        return "moepack writes no layout for that backend: serve the source checkpoint there"
    return f"re-convert the source to {layout}"


class GptOssMxfp4Builder:
    """One gpt-oss MXFP4 layer on vLLM's own GptOssMxfp4MoEMethod (module docstring)."""

    name = ""
    layout = ""
    backend_name = ""  # Mxfp4MoeBackend member the artifact is written for
    dtypes: dict = {}

    def __init__(self, method) -> None:
        from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import Mxfp4MoeBackend
        from vllm.model_executor.layers.quantization.mxfp4 import GptOssMxfp4MoEMethod

        self.method = method
        m = method.manifest
        where = method.where
        if m.layout != self.layout or m.source_method != GPT_OSS:
            raise ArtifactError(f"{where}: kernel builder {self.name} serves {self.layout} "
                                f"artifacts of gpt-oss MXFP4, not {m.layout} from "
                                f"{m.source_method}")
        self.backend = Mxfp4MoeBackend[self.backend_name]
        try:
            self.vllm_method = GptOssMxfp4MoEMethod(method.moe)
        except NotImplementedError as e:
            raise ArtifactError(
                f"{where}: layout {self.layout!r} is written for Mxfp4MoeBackend."
                f"{self.backend_name}, but vLLM's oracle finds no MXFP4 backend for gpt-oss on "
                f"this deployment ({str(e)[:200]})") from e
        picked = self.vllm_method.mxfp4_backend
        if picked != self.backend:
            raise ArtifactError(
                f"{where}: layout {self.layout!r} is written for Mxfp4MoeBackend."
                f"{self.backend_name}, but on this GPU vLLM {m.vllm_target}'s oracle picks "
                f"Mxfp4MoeBackend.{picked.name} for gpt-oss (what stock vLLM runs here); "
                f"{conversion_hint(picked.name)}")
        self.experts_cls = self.vllm_method.experts_cls

    # ---- sizes and parameters ----

    def roundup_sizes(self, hidden: int, inter: int) -> tuple[int, int]:
        from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
            mxfp4_round_up_hidden_size_and_intermediate_size,
        )

        return mxfp4_round_up_hidden_size_and_intermediate_size(self.backend, hidden, inter)

    def sizes(self) -> tuple[int, int, int]:
        """(experts, hidden, intermediate) vLLM must build: the hidden size the biases carry
        (w2_bias [E, H or Hp]) and the padded intermediate (inter_padded)."""
        L = self.method.art
        w2_bias = L.roles.get("w2_bias")  # its absence is check()'s to report
        hidden = L.params[w2_bias][1][-1] if w2_bias is not None else L.hidden
        return L.experts, hidden, L.inter_padded

    def check(self, where: str) -> None:
        art, moe = self.method.art, self.method.moe
        if sorted(art.roles) != sorted(_ROLES):
            raise ArtifactError(f"{where}: param_roles {sorted(art.roles)}: {self.name} serves "
                                f"exactly {sorted(_ROLES)}")
        for role, want in self.dtypes.items():
            got = art.params[art.roles[role]][0]
            if got != want:
                raise ArtifactError(f"{where}: {art.roles[role]} is {got}; {self.layout} holds "
                                    f"{want} there (what vLLM's {self.backend_name} reads)")
        act = getattr(moe.activation, "name", str(moe.activation))
        if not moe.has_bias or act != "SWIGLUOAI":
            raise ArtifactError(
                f"{where}: gpt-oss experts (biases, swigluoai on interleaved gate/up rows), but "
                f"vLLM builds this MoE layer with has_bias={moe.has_bias}, activation {act}: "
                "serve it as the gpt-oss model it was converted from")

    def create_weights(self, layer, sizes, params_dtype, extra_weight_attrs) -> None:
        """vLLM's own create_weights on the meta device; its names must be the manifest's."""
        import torch

        before = set(layer._parameters)
        with torch.device("meta"):
            self.vllm_method.create_weights(layer, *sizes, params_dtype, **extra_weight_attrs)
        made = sorted(set(layer._parameters) - before)
        if made != sorted(self.method.art.params):
            raise ArtifactError(
                f"{self.method.where}: vLLM's GptOssMxfp4MoEMethod creates {made}, the manifest "
                f"lists {sorted(self.method.art.params)}: the artifact's names are not this "
                "vLLM's")

    # ---- after loading: what the conversion would leave, then vLLM's kernel ----

    def place_converted(self, layer) -> None:
        """Leave the layer as convert_gpt_oss_weight_to_mxfp4_moe_kernel_format + _setup_kernel
        leave it for the backend (nothing to do where the parameters are the result)."""

    def build(self, layer):
        from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import make_mxfp4_moe_kernel

        inner = self.vllm_method
        self.place_converted(layer)
        inner.moe_quant_config = inner.get_fused_moe_quant_config(layer)
        inner.moe_kernel = make_mxfp4_moe_kernel(
            moe_quant_config=inner.moe_quant_config, moe_config=inner.moe,
            mxfp4_backend=self.backend, experts_cls=inner.experts_cls,
            routing_tables=layer._expert_routing_tables())
        inner.moe_kernel.fused_experts.process_weights_after_loading(layer)
        return inner.moe_quant_config, inner.moe_kernel


class GptOssTritonBuilder(GptOssMxfp4Builder):
    """`triton-mxfp4` on Mxfp4MoeBackend.TRITON (Hopper): the OAI Triton kernels."""

    name = "gpt-oss-triton"
    layout = "triton-mxfp4"
    backend_name = "TRITON"
    dtypes = {"w13_weight": "U8", "w2_weight": "U8", "w13_scale": "U8", "w2_scale": "U8",
              "w13_bias": "F32", "w2_bias": "F32"}

    def place_converted(self, layer) -> None:
        from vllm.utils.import_utils import has_triton_kernels

        from .triton_mxfp4 import TritonMxfp4Error, wrap_triton_mxfp4

        if not has_triton_kernels():  # also makes vLLM's vendored copy importable by that name
            raise ArtifactError(f"{self.method.where}: triton_kernels is not importable")
        art = self.method.art
        local = {role: art.roles[role] for role in _ROLES}
        _, hidden, inter_padded = self.sizes()
        try:
            w = wrap_triton_mxfp4(
                *(getattr(layer, local[r]) for r in ("w13_weight", "w2_weight", "w13_scale",
                                                     "w2_scale")),
                hidden=hidden, inter_padded=inter_padded)
        except TritonMxfp4Error as e:
            raise ArtifactError(f"{self.method.where}: {e}") from e
        # vLLM's TRITON branch deletes the four parameters (the Tensors' storages, views of the
        # loaded buffers, keep their memory), sets the Tensors on the layer and the precision
        # configs on the method; the float32 biases stay parameters.
        for r in ("w13_weight", "w2_weight", "w13_scale", "w2_scale"):
            delattr(layer, local[r])
        layer.w13_weight = w.w13
        layer.w2_weight = w.w2
        self.vllm_method.w13_precision_config = w.w13_precision
        self.vllm_method.w2_precision_config = w.w2_precision


class GptOssTrtllmBuilder(GptOssMxfp4Builder):
    """`trtllm-mxfp4` on Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_BF16 (Blackwell, sm100): the
    parameters are what the conversion leaves (replace_parameter), read by TrtLlmMxfp4Experts."""

    name = "gpt-oss-trtllm"
    layout = "trtllm-mxfp4"
    backend_name = "FLASHINFER_TRTLLM_MXFP4_BF16"
    dtypes = {"w13_weight": "U8", "w2_weight": "U8", "w13_scale": "F8_E4M3",
              "w2_scale": "F8_E4M3", "w13_bias": "F32", "w2_bias": "F32"}

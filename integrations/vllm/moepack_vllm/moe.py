"""The MoE method of a moepack artifact: parameters created from moepack.json (names, dtypes,
shapes), loaded byte for byte, and then served by one of the two paths the layout row exported
(moepack.json "serving"; docs/vllm.md "Serving paths"):

(a) "vllm-method": vLLM's own MoE method for the source format (built from the source's
    quantization config, nested in config.json) runs its process_weights_after_loading under
    weights_already_processed(): it transforms no tensor and only builds its kernel, as for
    `vllm preload`'s post-processed weights. Its oracle must have picked the backend the artifact
    was written for (serving.vllm_backend); otherwise the layer is refused, naming both.
(b) "kernel-builder": vLLM's method has no such path; the plugin builds vLLM's own modular kernel
    for the layout with the builder named in the manifest (KERNEL_BUILDERS), finding the
    parameters by their exported roles. A builder may instead run vLLM's own method around its
    conversion (gpt_oss_builder.py: its `vllm_method` then creates the weights and runs the layer).

Nothing here knows a layout's parameter names: they are the manifest's.
"""

from __future__ import annotations

import enum

import torch

from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts
from vllm.model_executor.utils import weights_already_processed

from .artifact import ArtifactError, Layer, Manifest
from .gpt_oss_builder import GptOssTritonBuilder, GptOssTrtllmBuilder, conversion_hint
from .humming_builder import Wna16HummingBuilder

_DTYPES = {"I32": torch.int32, "BF16": torch.bfloat16, "F16": torch.float16,
           "F32": torch.float32, "U8": torch.uint8, "I8": torch.int8, "I64": torch.int64,
           "F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu}


# ---- path (b): kernel builders, one per layout vLLM's methods cannot take pre-processed ----

# Set to 1 to serve a Marlin artifact where stock vLLM would run Humming (slower at prefill).
ALLOW_SLOWER_ENV = "MOEPACK_VLLM_ALLOW_SLOWER_KERNEL"


def refuse_slower_than_stock(manifest: Manifest, where: str) -> None:
    """A group-quantized WNA16 Marlin artifact on a GPU where vLLM 0.33's own oracle puts Humming
    first (prioritize_humming: compute capability 9.0) with humming installed: stock vLLM serves
    the source through Humming, up to 1.9x faster at prefill on an H100 (bench/RESULTS.md). The
    plugin never serves the slower kernel silently: it refuses unless ALLOW_SLOWER_ENV=1."""
    import os

    from vllm.model_executor.layers.quantization.utils.humming.priority import prefers_humming
    from vllm.utils.import_utils import has_humming

    from . import humming_builder

    cc = humming_builder.device_sm()
    if cc is None or not prefers_humming(cc) or not has_humming():
        return
    # Channelwise checkpoints: vLLM 0.33's Humming path cannot load them (GPTQ: the LayerConfig
    # asserts a group; compressed-tensors: the method asserts the group strategy off Marlin), so
    # Marlin is what stock can run too (moepack's humming row refuses them the same way).
    if manifest.group_size <= 0:
        return
    if os.environ.get(ALLOW_SLOWER_ENV) == "1":
        return
    raise ArtifactError(
        f"{where}: backend 'marlin': on this GPU vLLM {manifest.vllm_target} runs Humming for "
        "the same checkpoint (prioritize_humming), which is up to 1.9x faster at prefill than "
        "Marlin on an H100; re-convert with the default backend for --target-arch sm90 "
        f"(humming), or set {ALLOW_SLOWER_ENV}=1 to serve Marlin anyway")


# gpt-oss' MXFP4 experts (target_quant_params.method): biases, gate/up interleaved, swigluoai.
GPT_OSS = "gpt-oss-mxfp4"
# What vLLM 0.33's GptOssMxfp4MoEMethod.get_fused_moe_quant_config passes for every backend:
# swigluoai's alpha, beta (up + 1) and clamp limit.
GPT_OSS_SWIGLU = {"gemm1_alpha": 1.702, "gemm1_beta": 1.0, "swiglu_limit": 7.0}


# FP8 sources with one scale per output channel or per tensor: no weight_block_size, one scale
# group (the kernel runs them channelwise).
FP8_UNBLOCKED = ("compressed-tensors-fp8-channel", "compressed-tensors-fp8-tensor", "modelopt-fp8")


def refuse_float_marlin_slower_than_stock(manifest: Manifest, where: str) -> None:
    """The same rule for the float Marlin layouts, from the layout the row wrote: on a GPU where
    vLLM 0.33's own oracle runs another kernel for the source, the plugin refuses the Marlin
    artifact unless ALLOW_SLOWER_ENV=1. MXFP8 and NVFP4 (oracle/mxfp8.py, oracle/nvfp4.py):
    prioritize_humming puts Humming ahead of Marlin at compute capability 9.0 where humming is
    installed (compressed-tensors MXFP4 has no Humming path: Marlin below Blackwell). FP8 block
    (oracle/fp8.py): Triton's FP8 W8A8 kernel (FP8 tensor cores) comes before Marlin wherever
    supports_fp8() (capability 8.9 and up; on 9.0 the oracle moves it to the front); Marlin, a
    16-bit-activation kernel, is vLLM's pick only on 8.0/8.6. FP8 channel / per-tensor
    (compressed-tensors, ModelOpt FP8): Triton on 8.9; from 9.0 vLLM's CUTLASS (channel) or
    FlashInfer's CUTLASS (per-tensor, static activations) come first; Marlin only on 8.0/8.6."""
    import os

    from vllm.model_executor.layers.quantization.utils.humming.priority import prefers_humming
    from vllm.utils.import_utils import has_humming

    from . import humming_builder

    cc = humming_builder.device_sm()
    if cc is None or os.environ.get(ALLOW_SLOWER_ENV) == "1":
        return
    if manifest.layout in ("marlin-mxfp8", "marlin-nvfp4") and prefers_humming(cc) and \
            has_humming():
        stock = "Humming (prioritize_humming)"
    elif manifest.layout == "marlin-fp8" and manifest.source_method in FP8_UNBLOCKED and cc >= 89:
        stock = ("Triton's FP8 W8A8 kernel on FP8 tensor cores" if cc < 90 else
                 "vLLM's CUTLASS FP8 MoE (CutlassExpertsFp8)" if
                 manifest.source_method == "compressed-tensors-fp8-channel" else
                 "FlashInfer's FP8 MoE (FLASHINFER_CUTLASS / FLASHINFER_TRTLLM)")
    elif manifest.layout == "marlin-fp8" and 89 <= cc < 100:
        stock = "Triton's FP8 W8A8 kernel on FP8 tensor cores"
    elif manifest.source_method == GPT_OSS and 90 <= cc < 120:
        # _get_priority_backends_for_gpt_oss: the OAI Triton kernels (TRITON) on Hopper and
        # FlashInfer's TRT-LLM MXFP4 on Blackwell datacenter parts, both ahead of MARLIN
        # (prioritize_humming only moves Humming ahead of Marlin, behind TRITON; consumer
        # Blackwell, sm120, moves TRITON behind Marlin: Marlin is stock's pick there). moepack
        # writes both layouts and this plugin serves them: say which to convert to.
        backend = "TRITON" if cc < 100 else "FLASHINFER_TRTLLM_MXFP4_BF16"
        stock = f"Mxfp4MoeBackend.{backend} for gpt-oss"
        raise ArtifactError(
            f"{where}: layout {manifest.layout!r}: on this GPU (sm{cc}) vLLM "
            f"{manifest.vllm_target} runs {stock}, not Marlin's 16-bit-activation kernel; "
            f"{conversion_hint(backend)}, which this plugin serves, or set {ALLOW_SLOWER_ENV}=1 "
            "to serve Marlin anyway")
    else:
        return
    raise ArtifactError(
        f"{where}: layout {manifest.layout!r}: on this GPU (sm{cc}) vLLM {manifest.vllm_target} "
        f"runs {stock} for the same checkpoint, not Marlin's 16-bit-activation kernel; serve the "
        f"source checkpoint with stock vLLM there, or set {ALLOW_SLOWER_ENV}=1 to serve Marlin "
        "anyway")


class Wna16MarlinBuilder:
    """vLLM 0.33's Marlin WNA16 MoE kernel (MarlinExperts through make_wna16_moe_kernel), forced:
    its WNA16 oracle would put Humming first on SM90, which reads another layout."""

    name = "wna16-marlin"

    def __init__(self, method: "MoepackMoEMethod") -> None:
        from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend

        self.method = method
        self.experts_cls = MarlinExperts
        self.backend = WNA16MoEBackend.MARLIN

    def check(self, where: str) -> None:
        art = self.method.art
        refuse_slower_than_stock(self.method.manifest, where)
        for role in ("w13_weight", "w2_weight", "w13_scale", "w2_scale"):
            if role not in art.roles:
                raise ArtifactError(f"{where}: param_roles has no {role} (needed by {self.name})")
        for role in ("w13_g_idx", "w2_g_idx", "w13_sort_indices", "w2_sort_indices"):
            local = art.roles.get(role)
            if local is not None and art.params[local][1][-1] != 0:
                raise ArtifactError(
                    f"{where}: {local} {list(art.params[local][1])}: act-order layers are not "
                    "served (vLLM 0.33's Marlin MoE kernel takes no g_idx/perm)")

    def quant_config(self, layer: RoutedExperts):
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import (
            make_wna16_moe_quant_config,
        )

        p, m = self.method.param, self.method.manifest
        return make_wna16_moe_quant_config(
            w1_scale=p(layer, "w13_scale"), w2_scale=p(layer, "w2_scale"),
            group_size=m.group_size, num_bits=m.bits,
            w1_zp=p(layer, "w13_zero"), w2_zp=p(layer, "w2_zero"))

    def build(self, layer: RoutedExperts):
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import make_wna16_moe_kernel

        # The modular kernel reads w13_weight/w2_weight.
        layer.w13_weight = self.method.param(layer, "w13_weight")
        layer.w2_weight = self.method.param(layer, "w2_weight")
        quant_config = self.quant_config(layer)
        return quant_config, make_wna16_moe_kernel(
            moe_quant_config=quant_config, moe_config=self.method.moe,
            experts_cls=self.experts_cls, backend=self.backend,
            routing_tables=layer._expert_routing_tables())


class MarlinFloatBuilder:
    """vLLM 0.33's Marlin MoE kernel for float weights with 16-bit activations (MarlinExperts),
    built as vLLM's own methods build it after their prepare_*_for_marlin (docs/marlin_float.md):
    FP8 block (scales in the activation dtype, block [128, 128]), FP8 channel / per-tensor (one
    scale group, no block shape; per-tensor w13 as vLLM requantises it) and MXFP8 (E8M0, block
    [1, 32]) through the FP8 oracle's make_fp8_moe_kernel, backend MARLIN; NVFP4 (S0E5M3 block scales and
    the processed global scales, role w13/w2_global_scale) through make_nvfp4_moe_quant_config /
    make_nvfp4_moe_kernel, NvFp4MoeBackend.MARLIN, as ModelOptNvFp4FusedMoE and
    CompressedTensorsW4A4Nvfp4MoEMethod do; MXFP4 (E8M0) through make_mxfp4_moe_quant_config /
    make_mxfp4_moe_kernel, Mxfp4MoeBackend.MARLIN, as CompressedTensorsW4A4Mxfp4MoEMethod does.
    The parameters carry vLLM's padded intermediate; the kernel reads it from w2's shape
    (marlin_moe_intermediate_size).

    gpt-oss' MXFP4 (docs/gpt-oss.md "Served by the plugin"), as GptOssMxfp4MoEMethod builds it
    on MARLIN: the sizes rounded up by vLLM's own mxfp4_round_up_hidden_size_and_intermediate_size
    (maybe_roundup_sizes: the runner then pads the hidden states to Hp and cuts the output back),
    both biases (roles w13_bias / w2_bias) and swigluoai's constants in the quant config, the
    layer's SWIGLUOAI activation on w13's interleaved rows."""

    name = "marlin-float"

    def __init__(self, method: "MoepackMoEMethod") -> None:
        from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
        from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend

        self.method = method
        self.experts_cls = MarlinExperts
        self.backend = Fp8MoeBackend.MARLIN
        self.family = {"marlin-nvfp4": "nvfp4",
                       "marlin-mxfp4": "mxfp4"}.get(method.manifest.layout, "fp8")
        self.gpt_oss = self.family == "mxfp4" and method.manifest.source_method == GPT_OSS

    def roundup_sizes(self, hidden: int, inter: int) -> tuple[int, int]:
        """(hidden, intermediate) as vLLM's own MXFP4 method rounds them for MARLIN (gpt-oss:
        GptOssMxfp4MoEMethod.maybe_roundup_sizes); the other layouts keep vLLM's sizes."""
        if not self.gpt_oss:
            return hidden, inter
        from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
            Mxfp4MoeBackend,
            mxfp4_round_up_hidden_size_and_intermediate_size,
        )

        return mxfp4_round_up_hidden_size_and_intermediate_size(Mxfp4MoeBackend.MARLIN, hidden,
                                                                inter)

    def sizes(self) -> tuple[int, int, int]:
        """(experts, hidden, intermediate) the parameters are written for, as vLLM must build
        them: gpt-oss' padded Hp (w2_bias [E, Hp]) and Ip (inter_padded); the others' model
        sizes (their padding is the parameters', not vLLM's sizes)."""
        L = self.method.art
        if not self.gpt_oss:
            return L.experts, L.hidden, L.inter
        w2_bias = L.roles.get("w2_bias")  # its absence is check()'s to report
        hp = L.params[w2_bias][1][-1] if w2_bias is not None else L.hidden
        return L.experts, hp, L.inter_padded

    def block_shape(self) -> list[int] | None:
        """weight_block_size as vLLM's method holds it: MXFP8 [1, 32], FP8 block [128, 128], FP8
        channel / per-tensor None (CompressedTensorsW8A8Fp8MoEMethod, ModelOptFp8MoEMethod)."""
        art, m = self.method.art, self.method.manifest
        dtype = art.params[art.roles["w13_scale"]][0]
        if dtype == "F8_E8M0":
            return [1, 32]
        return None if m.source_method in FP8_UNBLOCKED else [128, 128]

    def roles(self) -> set:
        base = {"w13_weight", "w2_weight", "w13_scale", "w2_scale"}
        if self.gpt_oss:
            return base | {"w13_bias", "w2_bias"}
        return base | {"w13_global_scale", "w2_global_scale"} if self.family == "nvfp4" else base

    def check(self, where: str) -> None:
        art, m = self.method.art, self.method.manifest
        refuse_float_marlin_slower_than_stock(m, where)
        for role in sorted(self.roles()):
            if role not in art.roles:
                raise ArtifactError(f"{where}: param_roles has no {role} (needed by {self.name})")
        extra = sorted(set(art.roles) - self.roles())
        if extra:
            raise ArtifactError(f"{where}: param_roles {extra}: {self.name} serves float Marlin "
                                "layouts (weights, scales, NVFP4's global scales and gpt-oss' "
                                "biases only)")
        if self.gpt_oss:
            self.check_gpt_oss(where)
        dtypes = {art.params[art.roles[r]][0] for r in ("w13_scale", "w2_scale")}
        want = {"nvfp4": [{"F8_E4M3"}], "mxfp4": [{"F8_E8M0"}],
                "fp8": [{"F8_E8M0"}, {m.act_dtype}]}[self.family]
        if dtypes not in want:
            raise ArtifactError(f"{where}: scale dtypes {sorted(dtypes)}: {self.name} reads "
                                f"{' or '.join(sorted(d) for w in want for d in w)} scales for "
                                f"{m.layout}")
        if self.family == "nvfp4":
            g = {art.params[art.roles[r]][0] for r in ("w13_global_scale", "w2_global_scale")}
            if g != {"F32"}:
                raise ArtifactError(f"{where}: global scale dtypes {sorted(g)}: the Marlin "
                                    "kernel takes F32")

    def check_gpt_oss(self, where: str) -> None:
        """The layer vLLM builds must be gpt-oss' own: biases, SWIGLUOAI on interleaved rows."""
        art, moe = self.method.art, self.method.moe
        b = {art.params[art.roles[r]][0] for r in ("w13_bias", "w2_bias")}
        if b != {"BF16"}:
            raise ArtifactError(f"{where}: bias dtypes {sorted(b)}: the Marlin kernel's b_bias "
                                "is BF16 for gpt-oss")
        act = getattr(moe.activation, "name", str(moe.activation))
        if not moe.has_bias or act != "SWIGLUOAI":
            raise ArtifactError(
                f"{where}: gpt-oss experts (biases, swigluoai on interleaved gate/up rows), but "
                f"vLLM builds this MoE layer with has_bias={moe.has_bias}, activation {act}: "
                "serve it as the gpt-oss model it was converted from")

    def quant_config(self, layer: RoutedExperts):
        from vllm.model_executor.layers.fused_moe.oracle.fp8 import make_fp8_moe_quant_config

        p = self.method.param
        if self.family == "nvfp4":
            from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import (
                NvFp4MoeBackend,
                make_nvfp4_moe_quant_config,
            )

            return make_nvfp4_moe_quant_config(
                backend=NvFp4MoeBackend.MARLIN, w13_scale=p(layer, "w13_scale"),
                w2_scale=p(layer, "w2_scale"), w13_scale_2=p(layer, "w13_global_scale"),
                w2_scale_2=p(layer, "w2_global_scale"), a13_scale=None, a2_scale=None,
                layer=layer, use_a16=True)
        if self.family == "mxfp4":
            from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
                Mxfp4MoeBackend,
                make_mxfp4_moe_quant_config,
            )

            gpt_oss = dict(w1_bias=p(layer, "w13_bias"), w2_bias=p(layer, "w2_bias"),
                           **GPT_OSS_SWIGLU) if self.gpt_oss else {}
            return make_mxfp4_moe_quant_config(
                mxfp4_backend=Mxfp4MoeBackend.MARLIN, w1_scale=p(layer, "w13_scale"),
                w2_scale=p(layer, "w2_scale"), layer=layer, **gpt_oss)
        return make_fp8_moe_quant_config(
            fp8_backend=self.backend, w1_scale=p(layer, "w13_scale"),
            w2_scale=p(layer, "w2_scale"), a1_scale=None, a2_scale=None,
            block_shape=self.block_shape())

    def build(self, layer: RoutedExperts):
        from vllm.model_executor.layers.fused_moe.oracle.fp8 import make_fp8_moe_kernel

        layer.w13_weight = self.method.param(layer, "w13_weight")
        layer.w2_weight = self.method.param(layer, "w2_weight")
        quant_config = self.quant_config(layer)
        if self.family == "nvfp4":
            from vllm.model_executor.layers.fused_moe.oracle.nvfp4 import (
                NvFp4MoeBackend,
                make_nvfp4_moe_kernel,
            )

            return quant_config, make_nvfp4_moe_kernel(
                moe_quant_config=quant_config, moe_config=self.method.moe,
                experts_cls=self.experts_cls, backend=NvFp4MoeBackend.MARLIN,
                routing_tables=layer._expert_routing_tables())
        if self.family == "mxfp4":
            from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
                Mxfp4MoeBackend,
                make_mxfp4_moe_kernel,
            )

            return quant_config, make_mxfp4_moe_kernel(
                moe_quant_config=quant_config, moe_config=self.method.moe,
                experts_cls=self.experts_cls, mxfp4_backend=Mxfp4MoeBackend.MARLIN,
                routing_tables=layer._expert_routing_tables())
        return quant_config, make_fp8_moe_kernel(
            moe_quant_config=quant_config, moe_config=self.method.moe,
            experts_cls=self.experts_cls, fp8_backend=self.backend,
            routing_tables=layer._expert_routing_tables())


# The kernel-builder names a manifest may give (serving.kernel_builder).
KERNEL_BUILDERS = {b.name: b for b in (Wna16MarlinBuilder, Wna16HummingBuilder,
                                               MarlinFloatBuilder, GptOssTritonBuilder,
                                               GptOssTrtllmBuilder)}


def _oracle_choice(method, enum_class: str):
    """The member of vLLM's backend enum `enum_class` that `method` holds (its oracle's pick)."""
    for value in vars(method).values():
        if isinstance(value, enum.Enum) and type(value).__name__ == enum_class:
            return value
    return None


class MoepackMoEMethod(FusedMoEMethodBase):
    """Serves one MoE layer of a moepack artifact by the path its manifest names."""

    # Neither path transforms a tensor after loading.
    supports_pre_processed_weights = True

    def __init__(self, layer: RoutedExperts, manifest: Manifest, art: Layer, prefix: str,
                 source) -> None:
        super().__init__(layer.moe_config)
        self.manifest = manifest
        self.art = art
        self.prefix = prefix
        self.where = f"{manifest.path}: layer {art.module}"
        self.loaded: set[str] = set()
        self.inner: FusedMoEMethodBase | None = None  # path (a): vLLM's own method
        self.builder = None  # path (b)
        serving = manifest.serving
        if serving.path == "vllm-method":
            self.inner = self._vllm_method(layer, source)
        else:
            self.builder = KERNEL_BUILDERS[serving.kernel_builder](self)
            self.experts_cls = self.builder.experts_cls

    # ---- path (a): vLLM's method, checked against the manifest ----

    def _vllm_method(self, layer: RoutedExperts, source) -> FusedMoEMethodBase:
        s = self.manifest.serving
        inner = source.get_quant_method(layer, self.prefix)
        got = type(inner).__name__
        if got != s.vllm_method:
            raise ArtifactError(
                f"{self.manifest.path}: serving.vllm_method: the artifact is served by vLLM's "
                f"{s.vllm_method}, but vLLM's {type(source).__name__} gives {got} for "
                f"{self.prefix}")
        if not getattr(inner, "supports_pre_processed_weights", False):
            raise ArtifactError(
                f"{self.manifest.path}: serving.vllm_method: vLLM's {got} does not declare "
                "supports_pre_processed_weights in this vLLM")
        enum_class, member = s.vllm_backend.split(".")
        picked = _oracle_choice(inner, enum_class)
        if picked is None or picked.name != member:
            got_name = f"{enum_class}.{picked.name}" if picked is not None else "no backend"
            raise ArtifactError(
                f"{self.manifest.path}: serving.vllm_backend: the artifact is written for "
                f"{s.vllm_backend}, but vLLM's oracle picked {got_name} for {self.prefix} on "
                f"this deployment (its {got} would transform nothing and read the bytes with the "
                "wrong kernel); serve it where vLLM picks that backend "
                f"(serving.archs {list(s.archs)}) or re-convert for this GPU")
        return inner

    # ---- parameters ----

    def param(self, layer: RoutedExperts, role: str):
        """The layer's parameter with this role (param_roles), or None when it has none."""
        local = self.art.roles.get(role)
        return getattr(layer, local) if local is not None else None

    def maybe_roundup_sizes(self, hidden_size, intermediate_size_per_partition, act_dtype,
                            moe_parallel_config):
        if self.inner is not None:
            return self.inner.maybe_roundup_sizes(hidden_size, intermediate_size_per_partition,
                                                  act_dtype, moe_parallel_config)
        hidden, inter = super().maybe_roundup_sizes(hidden_size, intermediate_size_per_partition,
                                                    act_dtype, moe_parallel_config)
        roundup = getattr(self.builder, "roundup_sizes", None)
        return roundup(hidden, inter) if roundup is not None else (hidden, inter)

    def create_weights(self, layer: RoutedExperts, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs) -> None:
        L = self.art
        got = (num_experts, hidden_size, intermediate_size_per_partition)
        sizes = getattr(self.builder, "sizes", None)
        want = sizes() if sizes is not None else (L.experts, L.hidden, L.inter)
        if got != want:
            raise ArtifactError(
                f"{self.where}: written for (experts, hidden, intermediate) = {want}, vLLM "
                f"builds {got} for {self.prefix}")
        for local, (dtype, shape) in L.params.items():
            if dtype not in _DTYPES:
                raise ArtifactError(f"{self.where}: {local}: dtype {dtype} not served")
            if (dtype in ("BF16", "F16")) and _DTYPES[dtype] != params_dtype:
                raise ArtifactError(
                    f"{self.where}: {local} is {dtype}, the engine's dtype is {params_dtype}")
        if self.inner is not None:
            self._vllm_create_weights(layer, got, params_dtype, extra_weight_attrs)
        else:
            self.builder.check(self.where)
            vllm_create = getattr(self.builder, "create_weights", None)
            if vllm_create is not None:  # a builder on vLLM's own method: its create_weights
                vllm_create(layer, got, params_dtype, extra_weight_attrs)
        for local, (dtype, shape) in L.params.items():
            p = torch.nn.Parameter(torch.empty(shape, dtype=_DTYPES[dtype]), requires_grad=False)
            p.weight_loader = self._make_loader(local)
            layer._parameters.pop(local, None)
            layer.register_parameter(local, p)

    def _vllm_create_weights(self, layer, sizes, params_dtype, extra_weight_attrs) -> None:
        """vLLM's method creates its parameters on the meta device (as `vllm preload`'s loader
        builds the model), which also sets the layer attributes its post-processing reads; each
        is then replaced by the manifest's post-processed parameter of the same name."""
        before = set(layer._parameters)
        with torch.device("meta"):
            self.inner.create_weights(layer, *sizes, params_dtype, **extra_weight_attrs)
        made = sorted(set(layer._parameters) - before)
        if made != sorted(self.art.params):
            raise ArtifactError(
                f"{self.where}: vLLM's {type(self.inner).__name__} creates {made}, the manifest "
                f"lists {sorted(self.art.params)}: the artifact's names are not this vLLM's")

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
        if self.inner is None:
            self.moe_quant_config, self.moe_kernel = self.builder.build(layer)
            return
        before = {n: self._identity(layer, n) for n in self.art.params}
        with weights_already_processed():
            self.inner.process_weights_after_loading(layer)
        for n, ident in before.items():
            if self._identity(layer, n) != ident:
                raise ArtifactError(
                    f"{self.where}: vLLM's {type(self.inner).__name__} replaced or reshaped {n} "
                    "under weights_already_processed(); it must only build its kernel")
        self.moe_quant_config = self.inner.moe_quant_config
        self.moe_kernel = self.inner.moe_kernel

    @staticmethod
    def _identity(layer, name):
        p = layer._parameters.get(name)
        return None if p is None else (p.data_ptr(), p.dtype, tuple(p.shape))

    # ---- running: vLLM's method (a), the builder's vLLM method, or the built kernel (b) ----

    @property
    def _runs(self) -> FusedMoEMethodBase | None:
        """The vLLM method that runs the layer: path (a)'s, or a builder's own vLLM method
        (gpt_oss_builder: GptOssMxfp4MoEMethod with its kernel built); None: the plugin's."""
        if self.inner is not None:
            return self.inner
        return getattr(self.builder, "vllm_method", None)

    def get_fused_moe_quant_config(self, layer: RoutedExperts):
        if self._runs is not None:
            return self._runs.get_fused_moe_quant_config(layer)
        return self.builder.quant_config(layer)

    @property
    def is_monolithic(self) -> bool:
        if self._runs is not None:
            return self._runs.is_monolithic
        return super().is_monolithic

    @property
    def skip_forward_padding(self) -> bool:
        return self._runs.skip_forward_padding if self._runs is not None else False

    @property
    def has_unpadded_output(self) -> bool:
        return self._runs.has_unpadded_output if self._runs is not None else False

    def apply_monolithic(self, layer: RoutedExperts, x: torch.Tensor,
                         router_logits: torch.Tensor, input_ids: torch.Tensor | None = None):
        assert self._runs is not None, "only vLLM's own methods have monolithic kernels here"
        return self._runs.apply_monolithic(layer, x, router_logits, input_ids)

    def apply(self, layer: RoutedExperts, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, shared_experts, shared_experts_input):
        if self._runs is not None:
            return self._runs.apply(layer, x, topk_weights, topk_ids, shared_experts,
                                    shared_experts_input)
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
        if isinstance(self.quant_method, MoepackMoEMethod):
            return self.quant_method.load_layer_weights(self, weights)
        return original(self, weights)

    load_weights._moepack = True
    RoutedExperts.load_weights = load_weights


def patch_gpt_oss_loader() -> None:
    """vLLM 0.33's GptOssModel.load_weights reads a checkpoint whose quant_method is neither
    mxfp4 nor quark as transformers' bf16 tensors (_load_weights_other: every name holding
    ".w13_weight" narrowed along the intermediate and transposed). A moepack layer's parameters
    go by name to its MoE method instead, byte for byte; every other tensor, and every model
    without moepack layers, to vLLM's loader."""
    try:
        from vllm.model_executor.models.gpt_oss import GptOssModel
    except ImportError:  # a vLLM without gpt-oss: nothing to patch
        return
    original = GptOssModel.load_weights
    if getattr(original, "_moepack", False):
        return

    def load_weights(self, weights):
        mine = {}
        for name, mod in self.named_modules():
            if isinstance(mod, RoutedExperts) and isinstance(mod.quant_method, MoepackMoEMethod):
                for local in mod.quant_method.art.params:
                    mine[f"{name}.{local}"] = (mod, local)
        if not mine:
            return original(self, weights)
        loaded: set[str] = set()

        def others():
            for name, w in weights:
                hit = mine.get(name)
                if hit is None:
                    yield name, w
                    continue
                mod, local = hit
                mod.quant_method.copy_into(local, getattr(mod, local), w)
                loaded.add(name)

        rest = set(original(self, others()))
        return rest | loaded

    load_weights._moepack = True
    GptOssModel.load_weights = load_weights


def _served_rank(model) -> tuple[int, int] | None:
    """(rank, ranks) of the parallel moepack artifact `model` serves, None for any other model:
    the rank its moepack MoE layers were built for (MoepackConfig._rank_manifest)."""
    for m in model.modules():
        if isinstance(m, RoutedExperts) and isinstance(m.quant_method, MoepackMoEMethod):
            man = m.quant_method.manifest
            if man.parallel is None or man.rank is None:
                return None
            return man.rank, man.parallel.size
    return None


def patch_default_loader() -> None:
    """A rank of a parallel artifact reads its own expert files and the shared ones, never
    another rank's: vLLM 0.33's DefaultModelLoader skips the safetensors shards in which the
    model's `is_unused_checkpoint_weight` accepts every tensor (it reads their headers only), so
    the plugin marks the other ranks' "rankRR-of-NN/..." tensors unused for the load, and hands
    the model this rank's tensors under the layout's names (the prefix removed). Other models
    load as they do without the plugin."""
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from .artifact import rank_dir_name, rank_of_tensor

    original = DefaultModelLoader.get_all_weights
    if getattr(original, "_moepack", False):
        return

    def get_all_weights(self, model_config, model):
        served = _served_rank(model)
        if served is None:
            yield from original(self, model_config, model)
            return
        rank, ranks = served
        mine = rank_dir_name(rank, ranks) + "/"
        before = model.__dict__.get("is_unused_checkpoint_weight")
        inherited = getattr(model, "is_unused_checkpoint_weight", None)

        def unused(name: str) -> bool:
            r = rank_of_tensor(name)
            if r is not None:
                return r != rank
            return bool(inherited(name)) if inherited is not None else False

        model.is_unused_checkpoint_weight = unused
        try:
            for name, tensor in original(self, model_config, model):
                r = rank_of_tensor(name)
                if r is None:
                    yield name, tensor
                elif r == rank:
                    yield name[len(mine):], tensor
                else:
                    raise ArtifactError(
                        f"{model_config.model}: rank {rank} was handed {name}, a tensor of rank "
                        f"{r}: a safetensors file mixes ranks (moepack writes each rank's "
                        "tensors in its own files)")
        finally:
            if before is None:
                model.__dict__.pop("is_unused_checkpoint_weight", None)
            else:
                model.__dict__["is_unused_checkpoint_weight"] = before

    get_all_weights._moepack = True
    DefaultModelLoader.get_all_weights = get_all_weights

"""Serving path (b) for moepack's `humming` layout: vLLM 0.33's own Humming MoE experts
(HummingIndexedExperts / HummingGroupedExperts / BatchedHummingGroupedExperts, selected by vLLM's
own is_supported_config in its WNA16 oracle's order) built on the artifact's parameters.

vLLM's WNA16 methods run convert_to_humming_moe_kernel_format in process_weights_after_loading
and have no pre-processed path, so the plugin restores what that post-processing leaves on the
layer beside the parameters: `humming_configs` (the two LayerConfigs, rebuilt from the strings
moepack.json records), `weight_schemas` and `input_schemas` (what get_humming_moe_quant_config
reads), then builds the kernel with vLLM's get_humming_moe_quant_config and
make_wna16_moe_kernel (backend HUMMING).

Refused, naming the manifest field: an artifact written for another humming-kernels version than
the one installed (layout_config.kernel_version), for another SM than the GPU's
(layout_config.sm_version: Humming's LayerConfig.check_device would fail on every forward), or
whose LayerConfig disagrees with its parameters (shapes, padding, experts, bits, group, zero
points, dtype) or with itself (a string humming does not reproduce).
"""

from __future__ import annotations

import json
from pathlib import Path

from . import humming_tuning
from .artifact import ArtifactError

# LayerConfig fields of the 16-bit-activation WNA16 layout moepack writes, and the value each
# must have whatever the layer (the others are checked against the parameters below).
_FIXED_FIELDS = {"as_dtype": None, "input_quant_mode": "none", "input_scale_group_size": 0,
                 "weight_scale_group_size_n": 0, "weight_scale_2_type": "none",
                 "use_int_weight_scale": False, "use_fused_e8m0_scale": False,
                 "is_fp_zero_point": False, "has_bias": False, "use_packed_k_layout": False}


def installed_humming_version() -> str | None:
    try:
        import humming
    except ImportError:
        return None
    return str(getattr(humming, "__version__", "unknown"))


def device_sm() -> int | None:
    """The CUDA GPU's compute capability as Humming's sm_version (major * 10 + minor), or None
    where vLLM runs on no CUDA GPU."""
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return None
    cap = current_platform.get_device_capability()
    return cap.to_int() if cap is not None else None


def _roundup(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def expected_layer_config(art, sub: str, bits: int, group: int, dtype_name: str,
                          b_dtype: str) -> dict:
    """The LayerConfig fields moepack's Humming layout implies for sublayer `sub` of a layer of
    this shape (vLLM pads N to 256 and K to 128 after stacking gate|up)."""
    n, k = (2 * art.inter if art.gated else art.inter, art.hidden) if sub == "w13" else \
        (art.hidden, art.inter)
    np_, kp = _roundup(n, 256), _roundup(k, 128)
    return {"shape_n": np_, "shape_k": kp, "pad_shape_n": np_ - n, "pad_shape_k": kp - k,
            "num_experts": art.experts, "b_dtype": b_dtype, "a_dtype": dtype_name,
            "c_dtype": dtype_name, "bs_dtype": dtype_name,
            "weight_scale_group_size": group if group > 0 else 0,
            "weight_scale_type": "group" if group > 0 else "channel",
            "has_zero_point": None, **_FIXED_FIELDS}


def check_layout_config(manifest, art, dtype_name: str, device_sm: int | None,
                        humming_version: str | None) -> dict:
    """Checks one layer's recorded Humming configuration against this humming, this GPU and
    the layer's parameters; returns {"w13": dict, "w2": dict} of the recorded LayerConfig JSON.
    Every refusal names the manifest field."""
    where = f"{manifest.path}: {art.record or f'layers[{art.index}]'}.layout_config"
    cfg = art.layout_config
    for key in ("kernel_package", "kernel_version", "sm_version", "w13_layer_config",
                "w2_layer_config"):
        if key not in cfg:
            raise ArtifactError(f"{where}.{key} is missing (needed by wna16-humming)")
    if cfg["kernel_package"] != "humming-kernels":
        raise ArtifactError(f"{where}.kernel_package {cfg['kernel_package']!r}: expected "
                            "'humming-kernels'")
    if humming_version is None:
        raise ArtifactError(
            f"{where}.kernel_version {cfg['kernel_version']!r}: humming-kernels is not "
            "installed in this environment (vLLM 0.33.0 pins humming-kernels[cu13]==0.1.19)")
    if cfg["kernel_version"] != humming_version:
        raise ArtifactError(
            f"{where}.kernel_version: the artifact is laid out for humming-kernels "
            f"{cfg['kernel_version']}, this environment has {humming_version}: Humming records no "
            "layout version, its release is the version; re-convert with a moepack that writes "
            f"humming-kernels {humming_version}")
    if device_sm is not None and str(device_sm) != cfg["sm_version"]:
        raise ArtifactError(
            f"{where}.sm_version: the artifact's LayerConfig is for sm{cfg['sm_version']}, this "
            f"GPU is sm{device_sm} (Humming's LayerConfig.check_device refuses it): re-convert "
            f"with --target-arch sm{device_sm} or serve it on an sm{cfg['sm_version']} GPU")
    out = {}
    for sub in ("w13", "w2"):
        field_where = f"{where}.{sub}_layer_config"
        try:
            got = json.loads(cfg[f"{sub}_layer_config"])
        except ValueError as e:
            raise ArtifactError(f"{field_where}: not JSON ({e})") from e
        if not isinstance(got, dict):
            raise ArtifactError(f"{field_where}: expected a JSON object")
        if str(got.get("sm_version")) != cfg["sm_version"]:
            raise ArtifactError(f"{field_where}.sm_version {got.get('sm_version')!r} differs from "
                                f"{where}.sm_version {cfg['sm_version']!r}")
        b_dtype = art.layout_decisions.get(f"{sub}_b_dtype", f"uint{manifest.bits}")
        want = expected_layer_config(art, sub, manifest.bits, manifest.group_size, dtype_name,
                                     b_dtype)
        want["has_zero_point"] = f"{sub}_zero" in art.roles
        for name, value in want.items():
            if got.get(name, "<absent>") != value:
                raise ArtifactError(
                    f"{field_where}.{name}: {got.get(name, '<absent>')!r}, but the layer's "
                    f"parameters and layout decisions imply {value!r}")
        _check_param_shapes(art, sub, got, manifest.bits, field_where)
        out[sub] = got
    return out


def _check_param_shapes(art, sub: str, lc: dict, bits: int, where: str) -> None:
    e, n, k, g = lc["num_experts"], lc["shape_n"], lc["shape_k"], lc["weight_scale_group_size"]
    want = {f"{sub}_weight": (e, k // 16, n * 16 * bits // 32),
            f"{sub}_scale": (e, k // g if g else 1, n)}
    if lc["has_zero_point"]:
        want[f"{sub}_zero"] = (e, k // g if g else 1, n * bits // 32)
    for role, shape in want.items():
        local = art.roles.get(role)
        if local is None:
            raise ArtifactError(f"{where}: param_roles has no {role}")
        got = tuple(art.params[local][1])
        if got != shape:
            raise ArtifactError(
                f"{where}: shape_n {n}, shape_k {k}, num_experts {e}, group "
                f"{g} imply {local} {list(shape)}, the manifest has {list(got)}")


class Wna16HummingBuilder:
    """vLLM 0.33's Humming WNA16 MoE kernel on a moepack `humming` artifact."""

    name = "wna16-humming"

    def __init__(self, method) -> None:
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend

        self.method = method
        self.backend = WNA16MoEBackend.HUMMING
        self.configs: dict | None = None
        self.experts_cls = self._select_experts()

    def _weight_key(self):
        """The QuantKey vLLM's own method for the source passes to select_wna16_moe_backend
        (AutoGPTQMoEMethod, AutoAWQMoEMethod, CompressedTensorsWNA16MoEMethod)."""
        from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16 import (  # noqa: E501
            WNA16_SUPPORTED_TYPES_MAP,
            WNA16_ZP_SUPPORTED_TYPES_MAP,
        )
        from vllm.model_executor.layers.quantization.utils.quant_utils import (
            QuantKey,
            kInt4Static,
            kInt4Static32GroupScale,
            kInt4StaticGroupScale,
            kInt8StaticGroupScale,
        )
        from vllm.scalar_type import scalar_types

        m = self.method.manifest
        four = m.bits == 4
        scale = kInt4StaticGroupScale if four else kInt8StaticGroupScale
        if m.source_method == "awq":
            return kInt4Static
        if m.source_method == "gptq":
            return QuantKey(scalar_types.uint4b8 if four else scalar_types.uint8b128, scale)
        types = WNA16_SUPPORTED_TYPES_MAP if m.symmetric else WNA16_ZP_SUPPORTED_TYPES_MAP
        if four and m.group_size == 32:
            scale = kInt4Static32GroupScale
        return QuantKey(types[m.bits], scale, symmetric=m.symmetric)

    def _select_experts(self):
        """The first of vLLM's Humming experts classes that supports this deployment, by vLLM's
        own is_supported_config (select_wna16_moe_backend's loop for HUMMING)."""
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import backend_to_kernel_cls

        moe = self.method.moe
        fmt = (mk.FusedMoEActivationFormat.BatchedExperts
               if moe.moe_parallel_config.use_batched_activation_format
               else mk.FusedMoEActivationFormat.Standard)
        reasons = []
        for cls in backend_to_kernel_cls(self.backend):
            ok, reason = cls.is_supported_config(cls, moe, self._weight_key(), None, fmt)
            if ok:
                return cls
            reasons.append(f"{cls.__name__}: {reason}")
        raise ArtifactError(
            f"{self.method.manifest.path}: serving.kernel_builder 'wna16-humming': none of "
            f"vLLM's Humming experts supports this deployment ({'; '.join(reasons)})")

    def check(self, where: str) -> None:
        dtype = {"BF16": "bfloat16", "F16": "float16"}[self.method.manifest.act_dtype]
        self.configs = check_layout_config(self.method.manifest, self.method.art, dtype,
                                           device_sm(), installed_humming_version())

    def _layer_configs(self):
        from vllm.utils.humming import LayerConfig

        out = {}
        for sub, fields in self.configs.items():
            lc = LayerConfig(**fields)
            recorded = self.method.art.layout_config[f"{sub}_layer_config"]
            if lc.to_str() != recorded:
                raise ArtifactError(
                    f"{self.method.manifest.path}: "
                    f"{self.method.art.record or f'layers[{self.method.art.index}]'}.layout_config."
                    f"{sub}_layer_config: humming {installed_humming_version()} writes this "
                    f"LayerConfig as {lc.to_str()}, the artifact records {recorded}")
            out[sub] = lc
        return out

    def quant_config(self, layer):
        from vllm.model_executor.layers.quantization.utils.humming import (
            get_humming_moe_quant_config,
        )

        return get_humming_moe_quant_config(
            layer, gemm1_alpha=getattr(layer, "swiglu_alpha", None),
            gemm1_beta=getattr(layer, "swiglu_beta", None),
            gemm1_clamp_limit=getattr(layer, "swiglu_limit", None))

    def build(self, layer):
        """What convert_to_humming_moe_kernel_format leaves on the layer besides the parameters
        (humming_configs, weight_schemas, input_schemas), then vLLM's own kernel for it."""
        from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import make_wna16_moe_kernel
        from vllm.utils.humming import HummingInputSchema, HummingWeightSchema

        p = self.method.param
        # The names vLLM's Humming post-processing leaves (get_humming_moe_quant_config reads
        # w13_weight_scale / w13_zero_point by name; the modular kernel reads w13_weight).
        for sub in ("w13", "w2"):
            for role, attr in (("weight", "weight"), ("scale", "weight_scale"),
                               ("zero", "zero_point")):
                param = p(layer, f"{sub}_{role}")
                if param is not None and getattr(layer, f"{sub}_{attr}", None) is not param:
                    setattr(layer, f"{sub}_{attr}", param)
        configs = self._layer_configs()
        layer.humming_configs = configs
        layer.weight_schemas = {
            sub: HummingWeightSchema(
                b_dtype=str(lc.b_dtype), bs_dtype=str(lc.bs_dtype),
                weight_scale_group_size=lc.weight_scale_group_size,
                weight_scale_type=lc.weight_scale_type.value,
                has_zero_point=lc.has_zero_point)
            for sub, lc in configs.items()}
        layer.input_schemas = {sub: HummingInputSchema() for sub in configs}
        quant_config = self.quant_config(layer)
        # vLLM's experts compute humming's tuning tables in their constructor; tables that
        # `moepack-vllm seed-tuning` stored in the artifact for this GPU stand in for them.
        m = self.method.manifest
        where = f"{m.path}: layers[{self.method.art.index}]"
        with humming_tuning.seeded(Path(m.path).parent, where):
            return quant_config, make_wna16_moe_kernel(
                moe_quant_config=quant_config, moe_config=self.method.moe,
                experts_cls=self.experts_cls, backend=self.backend,
                routing_tables=layer._expert_routing_tables())

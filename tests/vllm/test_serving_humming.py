"""Serving path (b) "kernel-builder" `wna16-humming`, in the real vLLM 0.33.0 on the CPU: a GPTQ /
AWQ / compressed-tensors MoE checkpoint converted for sm90 by default (layout `humming`) is served
by vLLM 0.33's own Humming experts (HummingIndexedExperts, chosen by vLLM's is_supported_config),
its quant config built by vLLM's get_humming_moe_quant_config from the parameters the plugin
loaded byte for byte and the LayerConfigs rebuilt from moepack.json.

What runs is vLLM's and humming-kernels 0.1.19's code (installed in the venv: vLLM pins it):
the loader, MoepackMoEMethod, make_wna16_moe_kernel, HummingIndexedExperts.__init__ with its
tuning tables (humming.tune.get_heuristics_config), LayerConfig construction and to_str.

Stubbed, because they need a Hopper GPU, and nothing else (`pretend_hopper`):
  1. HummingExpertsBase._supports_current_device -> True (real: humming importable, CUDA, cc >= 7.5);
  2. humming.device.DeviceInfo -> an H100's values (sm 90, 132 SMs, 227 KiB shared memory: what
     the tuning tables read; real: humming's CUDA extension asks the driver);
  3. fused_humming_moe.create_humming_locks -> zeros on the CPU (real: on the CUDA device);
  4. moepack_vllm.humming_builder.device_sm -> 90 (real: vLLM's CUDA platform capability);
  5. humming.tune.get_device_index -> 0 and torch.cuda.device -> a no-op context (real: the CUDA
     device the tables are computed for).
No kernel runs: the forward needs humming's NVRTC JIT on a GPU (.humming/run_moepack.sh).
"""

from __future__ import annotations

import json

import pytest
import torch

import vllm_harness as h
from conftest import assert_byte_identical, edit_manifest

CASES = [("gptq", "qwen3", {}), ("awq", "qwen3", {}), ("ct-w4a16", "mixtral", {}),
         ("ct-w8a16", "qwen3", {"group_size": 64})]


class _H100:
    """What humming's DeviceInfo reports for an H100 SXM (the fields its tuning reads)."""

    index = 0
    name = "NVIDIA H100 80GB HBM3"
    is_ppu = False
    sm_count = 132
    sm_major, sm_minor, sm_version = 9, 0, 90
    max_threads_per_block = 1024
    max_threads_per_sm = 2048
    max_registers_per_sm = 65536
    l2_cache_size = 50 * 1024 * 1024
    max_smem_size = 232448
    default_smem_size = 49152


@pytest.fixture
def pretend_hopper(monkeypatch):
    import humming.device as hdev
    from vllm.model_executor.layers.fused_moe.experts import fused_humming_moe

    from moepack_vllm import humming_builder

    def new(cls, index=None):
        inst = object.__new__(cls)
        object.__setattr__(inst, "_index", 0)
        object.__setattr__(inst, "_value", _H100())
        return inst

    monkeypatch.setattr(hdev.DeviceInfo, "__new__", new)
    monkeypatch.setattr(hdev.DeviceInfo, "_get_value", lambda self: _H100(), raising=False)
    monkeypatch.setattr(fused_humming_moe.HummingExpertsBase, "_supports_current_device",
                        staticmethod(lambda: True))
    monkeypatch.setattr(fused_humming_moe, "create_humming_locks",
                        lambda device: torch.zeros(132 * 8, dtype=torch.int32))
    monkeypatch.setattr(humming_builder, "device_sm", lambda: 90)
    import contextlib

    import humming.tune as htune

    monkeypatch.setattr(htune, "get_device_index", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda index=None: contextlib.nullcontext())


def moepack_layers(model):
    from moepack_vllm.moe import MoepackMoEMethod

    return {n: m for n, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), MoepackMoEMethod)}


def humming_own_layer_config(L: dict, sub: str, bits: int, group: int, zero: bool,
                             b_dtype: str) -> str:
    """The LayerConfig humming-kernels' own prepare_layer_config gives this sublayer (what
    vLLM's _prepare_and_transform_sublayer asks: N padded to 256, K to 128), as its JSON."""
    from humming.schema import HummingInputSchema, HummingWeightSchema
    from humming.transform import prepare_layer_config

    n, k = (2 * L["inter"], L["hidden"]) if sub == "w13" else (L["hidden"], L["inter"])
    ws = HummingWeightSchema(b_dtype=b_dtype, bs_dtype="bfloat16", weight_scale_group_size=group,
                             weight_scale_type="group", has_zero_point=zero)
    return prepare_layer_config(shape_n=n, shape_k=k, weight_schema=ws,
                                input_schema=HummingInputSchema(), num_experts=L["experts"],
                                pad_n_to_multiple=256, pad_k_to_multiple=128, has_bias=False,
                                torch_dtype=torch.bfloat16).to_str()


def test_sm90_default_exports_humming_kernel_builder(artifacts):
    _, dst = artifacts.get("gptq", "qwen3")
    m = json.loads((dst / "moepack.json").read_text())
    assert m["backend"] == "humming" and m["target_arch"] == "sm90"
    assert m["serving"]["path"] == "kernel-builder"
    assert m["serving"]["kernel_builder"] == "wna16-humming"
    for L in m["layers"]:
        c = L["layout_config"]
        assert (c["kernel_package"], c["kernel_version"], c["sm_version"]) == \
            ("humming-kernels", "0.1.19", "90")
        assert set(L["param_roles"].values()) == {"w13_weight", "w2_weight", "w13_scale",
                                                  "w2_scale"}


@pytest.mark.parametrize("fmt,family,synth", CASES, ids=lambda c: c if isinstance(c, str) else
                         "-".join(f"{k}{v}" for k, v in c.items()))
def test_humming_serves_through_vllms_humming_experts(plugin, artifacts, pretend_hopper, fmt,
                                                      family, synth):
    from vllm.model_executor.layers.quantization.utils.humming.moe import HummingMoEQuantConfig

    _, dst = artifacts.get(fmt, family, **synth)
    model, cfg = h.load_model(str(dst))
    assert cfg.model_config.quantization == "moepack"
    manifest = json.loads((dst / "moepack.json").read_text())
    assert manifest["backend"] == "humming"
    assert assert_byte_identical(model, dst) >= 4 * len(manifest["layers"])
    layers = moepack_layers(model)
    assert len(layers) == len(manifest["layers"])
    tq = manifest["target_quant_params"]
    for (name, mod), L in zip(sorted(layers.items()), manifest["layers"]):
        q = mod.quant_method
        assert name == L["module"] + ".experts.routed_experts"
        assert q.inner is None and q.builder.name == "wna16-humming"
        experts = q.moe_kernel.fused_experts
        assert type(experts).__name__ == "HummingIndexedExperts"
        qc = q.moe_quant_config
        assert isinstance(qc, HummingMoEQuantConfig)
        assert qc.w1_scale is mod.w13_weight_scale and qc.w2_scale is mod.w2_weight_scale
        assert (qc.w1_zp is None) == tq["symmetric"]
        for sub, lc in (("w13", qc.w1_humming_config), ("w2", qc.w2_humming_config)):
            recorded = L["layout_config"][f"{sub}_layer_config"]
            assert lc.to_str() == recorded
            assert mod.humming_configs[sub] is lc
            # humming's own LayerConfig for this shape, independent of moepack's C++
            assert recorded == humming_own_layer_config(
                L, sub, tq["bits"], tq["group_size"], not tq["symmetric"],
                L["layout_decisions"][f"{sub}_b_dtype"])
        # the tuning tables vLLM's experts compute from those LayerConfigs (H100 values)
        assert experts.w13_tuning_config and experts.w2_tuning_config


def edited(artifacts, fn, name):
    _, dst = artifacts.get("gptq", "qwen3")
    d = artifacts.edited_copy(dst, name)
    edit_manifest(d, fn)
    return d


def set_config(key, value, layer=0):
    def fn(m):
        m["layers"][layer]["layout_config"][key] = value
    return fn


def set_layer_config_field(sub, field, value):
    def fn(m):
        lc = json.loads(m["layers"][0]["layout_config"][f"{sub}_layer_config"])
        lc[field] = value
        m["layers"][0]["layout_config"][f"{sub}_layer_config"] = json.dumps(lc)
    return fn


@pytest.mark.parametrize("edit,match", [
    (set_config("kernel_version", "0.1.18"),
     r"layers\[0\]\.layout_config\.kernel_version: the artifact is laid out for humming-kernels "
     r"0\.1\.18, this environment has 0\.1\.19"),
    (set_config("sm_version", "100"), r"layers\[0\]\.layout_config\.sm_version: the artifact's "
                                      r"LayerConfig is for sm100, this GPU is sm90"),
    (set_layer_config_field("w13", "sm_version", 100),
     r"layout_config\.w13_layer_config\.sm_version 100 differs from .*sm_version '90'"),
    (set_config("kernel_package", "humming"), r"layout_config\.kernel_package 'humming'"),
    (set_layer_config_field("w13", "shape_n", 512),
     r"layout_config\.w13_layer_config\.shape_n: 512, but the layer's parameters"),
    (set_layer_config_field("w2", "num_experts", 8),
     r"layout_config\.w2_layer_config\.num_experts: 8"),
    (set_layer_config_field("w13", "b_dtype", "float4e0m3"),
     r"layout_config\.w13_layer_config\.b_dtype: 'float4e0m3', but .* imply 'uint4'"),
    (set_layer_config_field("w2", "weight_scale_group_size", 64),
     r"layout_config\.w2_layer_config\.weight_scale_group_size: 64"),
    (set_layer_config_field("w13", "has_zero_point", True),
     r"layout_config\.w13_layer_config\.has_zero_point: True"),
    (set_layer_config_field("w2", "use_packed_k_layout", True),
     r"layout_config\.w2_layer_config\.use_packed_k_layout: True"),
], ids=["version", "sm", "sm-field", "package", "shape_n", "num_experts", "b_dtype", "group",
        "zero_point", "packed_k"])
def test_refuses_a_recorded_configuration_that_disagrees(plugin, artifacts, pretend_hopper, edit,
                                                         match):
    d = edited(artifacts, edit, "humming-bad")
    with pytest.raises(Exception, match=match):
        h.load_model(str(d))


def test_refuses_another_gpu_sm(plugin, artifacts, pretend_hopper, monkeypatch):
    from moepack_vllm import humming_builder

    _, dst = artifacts.get("gptq", "qwen3")
    monkeypatch.setattr(humming_builder, "device_sm", lambda: 100)
    with pytest.raises(Exception, match=r"layers\[0\]\.layout_config\.sm_version: the artifact's "
                                        r"LayerConfig is for sm90, this GPU is sm100"):
        h.load_model(str(dst))


def test_refuses_a_layer_config_string_humming_does_not_write(plugin, artifacts, pretend_hopper):
    """Same fields, other text (key order): the string keys humming's JIT; it must be humming's."""
    def reorder(m):
        lc = json.loads(m["layers"][0]["layout_config"]["w2_layer_config"])
        m["layers"][0]["layout_config"]["w2_layer_config"] = json.dumps(dict(sorted(lc.items())))
    d = edited(artifacts, reorder, "humming-order")
    with pytest.raises(Exception, match=r"layout_config\.w2_layer_config: humming 0\.1\.19 writes "
                                        r"this LayerConfig as"):
        h.load_model(str(d))


def test_marlin_artifact_where_stock_runs_humming_is_refused(plugin, artifacts, pretend_hopper,
                                                             monkeypatch):
    """On an sm90 GPU stock vLLM 0.33 serves the same checkpoint through Humming (faster at
    prefill): the plugin does not silently serve the slower Marlin layout there."""
    from moepack_vllm.moe import ALLOW_SLOWER_ENV

    _, dst = artifacts.get("gptq", "qwen3", "--backend", "marlin")
    monkeypatch.delenv(ALLOW_SLOWER_ENV, raising=False)
    with pytest.raises(Exception, match=r"backend 'marlin': on this GPU vLLM 0\.33 runs Humming"):
        h.load_model(str(dst))
    monkeypatch.setenv(ALLOW_SLOWER_ENV, "1")
    model, _ = h.load_model(str(dst))
    assert assert_byte_identical(model, dst) >= 4


def test_channelwise_marlin_artifact_is_served_on_hopper(plugin, artifacts, pretend_hopper,
                                                         monkeypatch):
    """Channelwise: stock vLLM 0.33's Humming path cannot load it either, so `auto` writes Marlin
    for sm90 and the plugin serves it there (nothing faster exists for it)."""
    from moepack_vllm.moe import ALLOW_SLOWER_ENV

    _, dst = artifacts.get("ct-w8a16", "qwen3")  # strategy channel
    assert json.loads((dst / "moepack.json").read_text())["backend"] == "marlin"
    monkeypatch.delenv(ALLOW_SLOWER_ENV, raising=False)
    model, _ = h.load_model(str(dst))
    assert assert_byte_identical(model, dst) >= 4

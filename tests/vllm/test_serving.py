"""moepack artifacts in the real vLLM 0.33.0, on the CPU: refused by stock vLLM, loaded byte for
byte through vLLM's own model loader with the moepack-vllm plugin, refused with a clear error
when incomplete or not servable here."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

os.environ["VLLM_PLUGINS"] = "none"  # stock vLLM first; the plugin is registered explicitly

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import vllm_harness as h  # noqa: E402
from conftest import assert_byte_identical, edit_config, edit_manifest  # noqa: E402

# The Marlin layout, named: on sm90 (convert's default arch) for vLLM 0.33 `auto` writes Humming
# (test_serving_humming.py).
MARLIN = ("--backend", "marlin")
STOCK_CASES = [("gptq", "qwen3"), ("awq", "mixtral"), ("ct-w4a16", "qwen3")]


# ---- stock vLLM (no plugin) ----

@pytest.mark.parametrize("fmt,family", STOCK_CASES)
def test_stock_vllm_refuses(artifacts, fmt, family):
    _, dst = artifacts.get(fmt, family, *MARLIN)
    with pytest.raises(Exception, match="Unknown quantization method: moepack"):
        h.engine_config(str(dst))


@pytest.mark.parametrize("fmt,arch", [("fp8-block", "sm80"), ("ct-fp8-block", "sm86"),
                                      ("modelopt-mxfp8", "sm89"), ("modelopt-nvfp4", "sm80"),
                                      ("ct-nvfp4", "sm86"), ("ct-mxfp4", "sm89"),
                                      ("ct-fp8-channel", "sm80"), ("ct-fp8-tensor", "sm86"),
                                      ("modelopt-fp8", "sm80")])
def test_stock_vllm_refuses_float_marlin(artifacts, fmt, arch):
    """vLLM 0.33's float Marlin layouts (marlin-fp8, marlin-mxfp8, marlin-nvfp4, marlin-mxfp4):
    stock vLLM refuses them too."""
    _, dst = artifacts.get(fmt, "qwen3", "--target-arch", arch)
    assert json.loads((dst / "moepack.json").read_text())["backend"].startswith("marlin-")
    with pytest.raises(Exception, match="Unknown quantization method: moepack"):
        h.engine_config(str(dst))


def test_stock_vllm_refuses_gpt_oss_marlin(artifacts):
    """gpt-oss' marlin-mxfp4 (tests/gpt_oss' published-format fixture, with its biases): stock
    vLLM refuses it as well, though its GptOssForCausalLM would take the source."""
    src = Path(__file__).resolve().parents[1] / "gpt_oss" / "fixtures" / "mxfp4"
    dst = artifacts.converted(src, "gpt-oss", "--target-arch", "sm80")
    m = json.loads((dst / "moepack.json").read_text())
    assert (m["backend"], m["source"]["format"]) == ("marlin-mxfp4", "gpt-oss-mxfp4")
    assert m["serving"] == {"archs": m["serving"]["archs"], "path": "kernel-builder",
                            "kernel_builder": "marlin-float"}
    with pytest.raises(Exception, match="Unknown quantization method: moepack"):
        h.engine_config(str(dst))


@pytest.mark.parametrize("layout,builder", [("triton-mxfp4", "gpt-oss-triton"),
                                            ("trtllm-mxfp4", "gpt-oss-trtllm")])
def test_stock_vllm_refuses_gpt_oss_own_kernel_layouts(artifacts, layout, builder):
    """gpt-oss' triton-mxfp4 (sm90) and trtllm-mxfp4 (sm100), which the plugin serves through
    vLLM's own GptOssMxfp4MoEMethod (test_serving_gpt_oss_fp4.py): stock vLLM refuses them."""
    from test_serving_gpt_oss_fp4 import artifact as gpt_oss_fp4_artifact

    _, dst = gpt_oss_fp4_artifact(artifacts, layout)
    m = json.loads((dst / "moepack.json").read_text())
    assert (m["backend"], m["source"]["format"]) == (layout, "gpt-oss-mxfp4")
    assert (m["serving"]["path"], m["serving"]["kernel_builder"]) == ("kernel-builder", builder)
    with pytest.raises(Exception, match="Unknown quantization method: moepack"):
        h.engine_config(str(dst))


def test_stock_vllm_refuses_forced_quantization(artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    with pytest.raises(Exception, match=r"\(moepack\) does not match"):
        h.engine_config(str(dst), quantization="gptq")


# ---- with the plugin (the `plugin` fixture registers it; this file runs before the others) ----

def test_entry_point_declared():
    eps = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert any(ep.name == "moepack" and ep.value == "moepack_vllm:register" for ep in eps)


LOAD_CASES = [("gptq", "qwen3"), ("gptq", "mixtral"), ("awq", "qwen3"), ("ct-w4a16", "qwen3"),
              ("ct-w8a16", "mixtral")]


@pytest.mark.parametrize("fmt,family", LOAD_CASES)
def test_plugin_loads_byte_identical(plugin, artifacts, fmt, family):
    _, dst = artifacts.get(fmt, family, *MARLIN)
    model, cfg = h.load_model(str(dst))
    assert cfg.model_config.quantization == "moepack"
    assert assert_byte_identical(model, dst) >= 4
    from moepack_vllm.moe import MoepackMoEMethod

    manifest = json.loads((dst / "moepack.json").read_text())
    assert manifest["serving"]["path"] == "kernel-builder"
    assert manifest["serving"]["kernel_builder"] == "wna16-marlin"
    methods = [m for m in model.modules() if isinstance(getattr(m, "quant_method", None),
                                                       MoepackMoEMethod)]
    assert len(methods) == len(manifest["layers"]), "not every layer served by the moepack method"
    for m in methods:
        assert m.quant_method.inner is None and m.quant_method.builder.name == "wna16-marlin"
        assert m.quant_method.moe_kernel is not None  # the kernel object was built
        assert type(m.quant_method.moe_kernel.fused_experts).__name__ == "MarlinExperts"


def rewrite(d, fn):
    p = d / "model.safetensors"
    tensors = load_file(str(p))
    fn(tensors)
    save_file(tensors, str(p), metadata={"format": "pt"})


def test_live_routed_experts_names_load(plugin, artifacts):
    """Legacy names (`...experts.w13_qweight`) load like vLLM 0.33's (`...routed_experts.`),
    which --vllm-target 0.33 writes."""
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "live-names")

    def rename(t):
        for n in [n for n in t if ".experts.routed_experts.w" in n]:
            t[n.replace(".experts.routed_experts.", ".experts.")] = t.pop(n)

    rewrite(d, rename)
    model, _ = h.load_model(str(d))
    assert assert_byte_identical(model, dst) >= 4


def test_missing_tensor_is_an_error(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "missing")
    rewrite(d, lambda t: t.pop("model.layers.1.mlp.experts.routed_experts.w2_scales"))
    with pytest.raises(Exception, match=r"holds no model\.layers\.1\.mlp\.experts\.routed_experts\.w2_scales"):
        h.load_model(str(d))


def test_extra_tensor_is_an_error(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "extra")
    rewrite(d, lambda t: t.__setitem__("model.layers.1.mlp.experts.routed_experts.w13_extra",
                                       torch.zeros(4, dtype=torch.int32)))
    with pytest.raises(Exception, match=r"'w13_extra' is not a parameter of this moepack layer"):
        h.load_model(str(d))


def test_wrong_shape_is_an_error(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "shape")
    n = "model.layers.1.mlp.experts.routed_experts.w2_scales"
    rewrite(d, lambda t: t.__setitem__(n, t[n][:, :, :-1].contiguous()))
    with pytest.raises(Exception, match=r"w2_scales: checkpoint tensor is torch.bfloat16"):
        h.load_model(str(d))


# ---- refusals ----

def test_refuses_other_tensor_parallel_size(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "tp2")
    edit_config(d, tensor_parallel_size=2)
    with pytest.raises(Exception, match=r"config\.json: quantization_config\.tensor_parallel_size: "
                                        "moepack artifact was written for tensor_parallel_size=2, "
                                        "the engine runs 1"):
        h.load_model(str(d))


def test_refuses_expert_parallel(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    with pytest.raises(Exception, match="moepack artifact was written for tensor_parallel_size=1, "
                                        "the engine runs expert parallelism over 1 ranks"):
        h.load_model(str(dst), enable_expert_parallel=True)


def test_refuses_tensor_parallel_artifact_at_another_degree(plugin, artifacts):
    """A real `convert --tensor-parallel-size 2` artifact in an engine of tensor_parallel_size 1:
    refused naming both degrees."""
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN, "--vllm-target", "0.33",
                           "--tensor-parallel-size", "2",
                           group_size=64)  # I / 2 = 64: a multiple of the group
    with pytest.raises(Exception, match=r"quantization_config\.tensor_parallel_size: moepack "
                                        "artifact was written for tensor_parallel_size=2, the "
                                        "engine runs 1"):
        h.load_model(str(dst))


def test_refuses_expert_parallel_artifact_without_expert_parallelism(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN, "--vllm-target", "0.33",
                           "--expert-parallel", "2")
    with pytest.raises(Exception, match=r"written for expert parallelism over 2 ranks "
                                        r"\(--enable-expert-parallel\), the engine runs "
                                        "tensor_parallel_size=1 without expert parallelism"):
        h.load_model(str(dst))


def test_refuses_manifest_digest_mismatch(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "digest")
    with open(d / "moepack.json", "a") as f:
        f.write(" ")
    with pytest.raises(Exception, match="differs from config.json's"):
        h.load_model(str(d))


def test_refuses_other_dtype(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    with pytest.raises(Exception, match=r"config\.json: quantization_config\.act_dtype: .*serve "
                                        "it with --dtype bfloat16"):
        h.load_model(str(dst), dtype="float16")


@pytest.mark.parametrize("field,value,match", [
    # config.json's block must describe the conversion moepack.json (digest-bound) describes.
    ("layout_version", 3, r"quantization_config\.layout_version 3 differs from .*moepack\.json's "
                          r"layout\.version 2"),
    ("vllm_target", "2026-05", "vllm_target '2026-05'"),
    ("backend", "triton-wna16", r"quantization_config\.backend 'triton-wna16' differs from "
                                r".*moepack\.json's backend 'marlin'"),
])
def test_refuses_unservable_config(plugin, artifacts, field, value, match):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, f"cfg-{field}")
    edit_config(d, **{field: value})
    with pytest.raises(Exception, match=match):
        h.engine_config(str(d))


def test_refuses_unserved_backend_artifact(plugin, artifacts):
    # The reason is the layout row's (moepack.json serving.reason), not a plugin table.
    _, dst = artifacts.get("gptq", "qwen3", "--backend", "triton-wna16")
    serving = json.loads((dst / "moepack.json").read_text())["serving"]
    assert serving["path"] == "none" and "MoeWNA16" in serving["reason"]
    with pytest.raises(Exception, match=r"moepack\.json: serving\.path \"none\": backend "
                                        r"'triton-wna16' is not served .*MoeWNA16"):
        h.engine_config(str(dst))


def test_refuses_manifest_version_1(plugin, artifacts):
    """A manifest from before the serving paths were exported (no serving, no param_roles)."""
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "manifest-v1")

    def to_v1(m):
        m["manifest_version"] = 1
        del m["serving"]
        for L in m["layers"]:
            del L["param_roles"]

    edit_manifest(d, to_v1)
    with pytest.raises(Exception, match=r"moepack\.json: manifest_version 1: this moepack-vllm "
                                        r"reads \[2, 3, 4\]"):
        h.engine_config(str(d))


def test_refuses_unknown_kernel_builder(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "builder")
    edit_manifest(d, lambda m: m["serving"].update(kernel_builder="wna16-future"))
    with pytest.raises(Exception, match=r"serving\.kernel_builder 'wna16-future': this "
                                        r"moepack-vllm has the kernel builders "
                                        r"\['gpt-oss-triton', 'gpt-oss-trtllm', 'marlin-float', "
                                        r"'wna16-humming', 'wna16-marlin'\]"):
        h.engine_config(str(d))


def test_marlin_finds_its_parameters_by_role(plugin, artifacts):
    """The kernel builder reads the manifest's roles, not names of its own: swapping the roles
    of the w13 and w2 scales makes vLLM's quant config take the other tensors."""
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    d = artifacts.edited_copy(dst, "roles")

    def swap(m):
        for L in m["layers"]:
            r = L["param_roles"]
            a = next(n for n, v in r.items() if v == "w13_scale")
            b = next(n for n, v in r.items() if v == "w2_scale")
            r[a], r[b] = "w2_scale", "w13_scale"

    edit_manifest(d, swap)
    model, _ = h.load_model(str(d))
    from moepack_vllm.moe import MoepackMoEMethod

    for mod in model.modules():
        q = getattr(mod, "quant_method", None)
        if isinstance(q, MoepackMoEMethod):
            assert q.moe_quant_config.w1_scale is mod.w2_scales
            assert q.moe_quant_config.w2_scale is mod.w13_scales
            break
    else:
        pytest.fail("no moepack layer")


def test_refuses_act_order(plugin, artifacts):
    # vLLM 0.33's own GPTQ config refuses desc_act first (the nested source block says so); the
    # plugin's own check covers a source block that does not.
    # moepack itself refuses act-order for --vllm-target 0.33 (exit 4); an act-order artifact is
    # one written for 2026-05, which this plugin refuses by its target.
    _, dst = artifacts.get("gptq-actorder", "qwen3", "--vllm-target", "2026-05")
    with pytest.raises(Exception,
                       match="act-order layers are not served|activation ordering|vllm_target"):
        h.load_model(str(dst))


def test_refuses_forced_other_quantization(plugin, artifacts):
    _, dst = artifacts.get("gptq", "qwen3", *MARLIN)
    with pytest.raises(Exception, match="--quantization gptq would read"):
        h.engine_config(str(dst), quantization="gptq")

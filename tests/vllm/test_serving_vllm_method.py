"""Serving path (a), "vllm-method", in the real vLLM 0.33.0 on the CPU: an FP8 block MoE artifact
(`moepack synth --format fp8-block`, `convert --target-arch sm100`: layout trtllm-fp8-block) is
served by vLLM's own Fp8Config / Fp8MoEMethod, whose process_weights_after_loading runs under
weights_already_processed() and only builds its kernel.

What runs is vLLM's code: Fp8Config built from the nested source block, Fp8MoEMethod (its FP8 MoE
oracle select_fp8_moe_backend, create_weights on the meta device, process_weights_after_loading in
pre-processed mode, get_fused_moe_quant_config), make_fp8_moe_kernel with its prepare/finalize and
TrtLlmFp8ExpertsMonolithic objects; for the comparison below also vLLM's stock loader and its
FlashInfer TRT-LLM post-processing (prepare_fp8_moe_layer_for_fi with FlashInfer's own
get_shuffle_matrix_a_row_indices, which runs on the CPU).

Stubbed, because they need a Blackwell GPU with FlashInfer (`pretend_blackwell`), and nothing else:
  1. TrtLlmFp8ExpertsBase._supports_current_device -> True (real: CUDA, device capability family
     100 and FlashInfer's TRT-LLM fused MoE present);
  2. the CPU FP8 experts (the classes of Fp8MoeBackend.CPU and .CPU_W8A8) report no support for
     the current device (on an AMX host vLLM's CPU platform ranks them first; a GPU host has none);
  3. torch.accelerator.current_device_index -> 0 (TrtLlmFp8ExpertsBase.__init__ asks for the
     CUDA device; this machine has no driver).
No kernel runs: the forward needs FlashInfer's sm100 cubins (a GPU check, docs/vllm.md).

Fixture repair, not a stub: `moepack synth --format fp8-block` stores attention, dense MLPs and the
router in BF16, but its config's ignored_layers lists only lm_head (a real DeepSeek FP8 checkpoint
quantises them); vLLM would build FP8 Linears for them. `ignore_bf16_linears` lists them in the
block vLLM reads (config.json only; moepack.json and the tensors stay as converted).
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors import safe_open

import vllm_harness as h
from conftest import assert_byte_identical, edit_manifest

FP8 = ("fp8-block", "qwen3", "--target-arch", "sm100")


def ignore_bf16_linears(d, nested: bool) -> None:
    """Adds every 2-D BF16/F16 `.weight` module of d (and vLLM's fused qkv_proj / gate_up_proj
    names for them) to the FP8 block's ignored_layers: nested (an artifact's
    source_quantization_config) or the source's own quantization_config."""
    mods = []
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                s = st.get_slice(k)
                if k.endswith(".weight") and s.get_dtype() in ("BF16", "F16") and \
                        len(s.get_shape()) == 2:
                    mods.append(k[:-len(".weight")])
    fused = [re.sub(r"\.(q|k|v)_proj$", ".qkv_proj", m) for m in mods]
    fused += [re.sub(r"\.(gate|up)_proj$", ".gate_up_proj", m) for m in mods]
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    q = cfg["quantization_config"]
    block = q["source_quantization_config"] if nested else q
    assert block["quant_method"] == "fp8"
    block["ignored_layers"] = sorted(set(block["ignored_layers"] + mods + fused))
    p.write_text(json.dumps(cfg, indent=2))


@pytest.fixture
def fp8(artifacts):
    """(source, artifact) copies with the BF16 Linears listed as ignored."""
    src, dst = artifacts.get(*FP8)
    s, d = artifacts.edited_copy(src, "fp8-src"), artifacts.edited_copy(dst, "fp8-art")
    ignore_bf16_linears(s, nested=False)
    ignore_bf16_linears(d, nested=True)
    return s, d


@pytest.fixture
def pretend_blackwell(monkeypatch):
    from vllm.model_executor.layers.fused_moe.experts import trtllm_fp8_moe
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend, backend_to_kernel_cls

    monkeypatch.setattr(trtllm_fp8_moe.TrtLlmFp8ExpertsBase, "_supports_current_device",
                        staticmethod(lambda: True))
    for backend in (Fp8MoeBackend.CPU, Fp8MoeBackend.CPU_W8A8):
        for cls in backend_to_kernel_cls(backend):
            monkeypatch.setattr(cls, "_supports_current_device", staticmethod(lambda: False))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)


def moepack_layers(model):
    from moepack_vllm.moe import MoepackMoEMethod

    return {n: m for n, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), MoepackMoEMethod)}


def test_fp8_block_artifact_exports_path_a(artifacts):
    _, dst = artifacts.get(*FP8)
    m = json.loads((dst / "moepack.json").read_text())
    assert m["manifest_version"] == 4 and m["backend"] == "trtllm-fp8-block"
    assert m["serving"] == {"path": "vllm-method", "vllm_method": "Fp8MoEMethod",
                            "vllm_backend": "Fp8MoeBackend.FLASHINFER_TRTLLM", "archs": ["sm100"]}
    for L in m["layers"]:
        roles = {L["param_roles"][n]: n[len(L["param_prefix"]):] for n in L["params"]}
        assert roles == {"w13_weight": "w13_weight", "w2_weight": "w2_weight",
                         "w13_scale": "w13_weight_scale_inv", "w2_scale": "w2_weight_scale_inv"}


def test_fp8_block_serves_through_vllms_fp8_method(plugin, fp8, pretend_blackwell, monkeypatch):
    from vllm.model_executor.layers.quantization import fp8 as vllm_fp8

    transforms, kernels = [], []

    def no_transform(*a, **kw):  # what process_weights_after_loading must skip here
        transforms.append(kw.get("fp8_backend"))
        raise AssertionError("vLLM transformed pre-processed weights")

    real_init = vllm_fp8.Fp8MoEMethod._init_moe_kernel

    def init_kernel(self, layer):
        kernels.append(layer)
        return real_init(self, layer)

    monkeypatch.setattr(vllm_fp8, "convert_to_fp8_moe_kernel_format", no_transform)
    monkeypatch.setattr(vllm_fp8.Fp8MoEMethod, "_init_moe_kernel", init_kernel)
    _, d = fp8
    model, cfg = h.load_model(str(d))
    assert cfg.model_config.quantization == "moepack"
    manifest = json.loads((d / "moepack.json").read_text())
    assert assert_byte_identical(model, d) == 4 * len(manifest["layers"])
    layers = moepack_layers(model)
    assert len(layers) == len(manifest["layers"]) and not transforms
    assert sorted(id(x) for x in kernels) == sorted(id(x) for x in layers.values())
    for (name, mod), L in zip(sorted(layers.items()), manifest["layers"]):
        q = mod.quant_method
        assert name == L["module"] + ".experts.routed_experts"
        assert type(q.inner).__name__ == "Fp8MoEMethod" and q.builder is None
        assert q.inner.fp8_backend.name == "FLASHINFER_TRTLLM"
        assert type(q.moe_kernel.fused_experts).__name__ == "TrtLlmFp8ExpertsMonolithic"
        assert q.is_monolithic and q.moe_quant_config is q.inner.moe_quant_config
        assert q.moe_quant_config.w1_scale is mod.w13_weight_scale_inv
        # Exactly the manifest's parameters, none left on the meta device by vLLM's create_weights.
        local = sorted(n[len(L["param_prefix"]):] for n in L["params"])
        assert sorted(mod._parameters) == local
        assert all(p.device.type == "cpu" for p in mod._parameters.values())
        assert mod.weight_block_size == [128, 128]  # set by vLLM's create_weights


def test_fp8_block_artifact_is_vllms_own_post_processed_state(plugin, fp8, pretend_blackwell):
    """Stock vLLM loads the *source* FP8 checkpoint and runs its own FLASHINFER_TRTLLM
    post-processing (W31 swap, FlashInfer's BlockMajorK shuffle, scale clamp); the artifact served
    through path (a) holds exactly those parameters: names, dtypes, shapes and bytes."""
    s, d = fp8
    stock, cfg = h.load_model(str(s))
    assert cfg.model_config.quantization == "fp8"
    served, _ = h.load_model(str(d))
    manifest = json.loads((d / "moepack.json").read_text())
    compared = 0
    for L in manifest["layers"]:
        name = L["module"] + ".experts.routed_experts"
        a = dict(stock.get_submodule(name).named_parameters(recurse=False))
        b = dict(served.get_submodule(name).named_parameters(recurse=False))
        assert type(stock.get_submodule(name).quant_method).__name__ == "Fp8MoEMethod"
        assert sorted(a) == sorted(b), f"{name}: vLLM leaves {sorted(a)}, served {sorted(b)}"
        for n in a:
            x, y = a[n].data, b[n].data
            assert (x.dtype, tuple(x.shape)) == (y.dtype, tuple(y.shape)), \
                f"{name}.{n}: vLLM {x.dtype} {list(x.shape)}, artifact {y.dtype} {list(y.shape)}"
            xb, yb = x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)
            diff = (xb != yb).nonzero()
            assert diff.numel() == 0, f"{name}.{n}: first differing byte at {diff[0].tolist()}"
            compared += 1
    assert compared == 4 * len(manifest["layers"])


def test_refuses_when_vllms_oracle_picks_another_backend(plugin, fp8):
    """vLLM's real FP8 MoE oracle on this machine (no Blackwell) does not pick FLASHINFER_TRTLLM;
    the layer is refused, naming both, before anything is loaded."""
    _, d = fp8
    with pytest.raises(Exception, match=(
            r"moepack\.json: serving\.vllm_backend: the artifact is written for "
            r"Fp8MoeBackend\.FLASHINFER_TRTLLM, but vLLM's oracle picked "
            r"(Fp8MoeBackend\.(?!FLASHINFER_TRTLLM)\w+|no backend) for "
            r"model\.layers\.1\.mlp\.experts")):
        h.load_model(str(d))


def test_refuses_other_vllm_method(plugin, fp8, pretend_blackwell, artifacts):
    _, d = fp8
    edit_manifest(d, lambda m: m["serving"].update(vllm_method="ModelOptMxFp8FusedMoE"))
    with pytest.raises(Exception, match=r"serving\.vllm_method: the artifact is served by vLLM's "
                                        r"ModelOptMxFp8FusedMoE, but vLLM's Fp8Config gives "
                                        r"Fp8MoEMethod"):
        h.load_model(str(d))


def test_refuses_names_vllms_method_does_not_create(plugin, fp8, pretend_blackwell):
    """A manifest whose parameter names are not the ones vLLM's method registers (here the
    per-tensor scale name for block scales) is refused before loading."""
    _, d = fp8

    def rename(m):
        for L in m["layers"]:
            old = L["param_prefix"] + "w13_weight_scale_inv"
            new = L["param_prefix"] + "w13_weight_scale"
            m["tensors"][new] = m["tensors"].pop(old)
            L["params"] = [new if n == old else n for n in L["params"]]
            L["param_roles"][new] = L["param_roles"].pop(old)

    edit_manifest(d, rename)
    with pytest.raises(Exception, match=r"vLLM's Fp8MoEMethod creates \[.*'w13_weight_scale_inv'"
                                        r".*\], the manifest lists \[.*'w13_weight_scale',"):
        h.load_model(str(d))


@pytest.mark.parametrize("fmt,backend,why", [
    ("ct-fp8-block", "trtllm-fp8-block", "CompressedTensorsW8A8Fp8MoEMethod does not declare "
                                         "supports_pre_processed_weights"),
    ("modelopt-mxfp8", "trtllm-mxfp8", "ModelOptMxFp8FusedMoE, "
                                       "CompressedTensorsW8A8Mxfp8MoEMethod\\) do not declare"),
])
def test_refuses_layouts_vllm_033_cannot_take_pre_processed(plugin, artifacts, fmt, backend, why):
    _, dst = artifacts.get(fmt, "qwen3", "--target-arch", "sm100")
    assert json.loads((dst / "moepack.json").read_text())["serving"]["path"] == "none"
    with pytest.raises(Exception, match=rf"serving\.path \"none\": backend '{backend}' is not "
                                        rf"served .*{why}"):
        h.engine_config(str(dst))


def test_capability_from_the_exported_archs(artifacts):
    """The GPU floor is the layout row's archs (serving.archs), checked without vLLM."""
    from moepack_vllm.artifact import ArtifactError, Block, check_capability, read_manifest

    for args, ok, low in ((FP8, 100, 90), (("gptq", "qwen3"), 80, 75)):
        _, dst = artifacts.get(*args)
        block = Block.parse(json.loads((dst / "config.json").read_text())["quantization_config"])
        m = read_manifest(str(dst), block)
        check_capability(m, ok)
        check_capability(m, None)  # not a CUDA platform: nothing to check
        with pytest.raises(ArtifactError, match=rf"needs an sm{ok}\+ GPU; this one is sm{low}"):
            check_capability(m, low)

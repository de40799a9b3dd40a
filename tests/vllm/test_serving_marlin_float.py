"""vLLM 0.33's float Marlin layouts (docs/marlin_float.md) served by the plugin in the real vLLM
0.33.0, on the CPU: FP8 block (`marlin-fp8`), MXFP8 (`marlin-mxfp8`), NVFP4 (`marlin-nvfp4`, ModelOpt
and compressed-tensors) and MXFP4 (`marlin-mxfp4`, compressed-tensors and gpt-oss: the published-
format fixture of tests/gpt_oss, with its biases, swigluoai on interleaved gate/up rows and vLLM's
hidden padding to Hp).

Serving paths (docs/vllm.md): DeepSeek-style FP8 block goes through vLLM's own Fp8MoEMethod under
weights_already_processed() (path a; its oracle must pick MARLIN), compressed-tensors FP8 block
and MXFP8, NVFP4 and MXFP4 through the plugin's `marlin-float` kernel builder (path b; their vLLM methods do not
take pre-processed weights); stock vLLM refusing them is in test_serving.py (it runs before the
plugin is registered). Each artifact loads byte for byte, and vLLM's whole MoE block runs on
it (router, runner, modular kernel, MarlinExperts, fused_marlin_moe) with CPU stand-ins for the
CUDA-only ops that compute from the parameters as the Marlin kernel reads them -- decoded in
tests/vllm/layouts.py from docs/marlin_float.md, independently of moepack's C++ -- against an fp32
MoE from the *source* checkpoint. A corrupted artifact (gate/up halves swapped, the pair swap of
the E8M0 / S0E5M3 scales dropped, NVFP4's processed global scale dropped; gpt-oss: gate and up
exchanged in the source, the biases dropped) lands far off. gpt-oss' routing (router bias, top-k
of the logits, softmax over the k chosen) is recomputed from the source's router and must be
the one vLLM's block took.

Stubbed for path (a), because this machine has no CUDA device (`pretend_ampere`), nothing else:
MarlinExperts._supports_current_device -> True (real: CUDA with capability >= 7.5), and vLLM's
CPU FP8 experts report no support (a GPU host has none). The oracle itself is vLLM's.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import vllm_harness as h
from conftest import assert_byte_identical
from layouts import (gpt_oss_experts, marlin_bias, marlin_float_weight, source_float_linear,
                     vllm_per_tensor_gate_up)
from serving_record import swiglu_oai
from test_serving_forward import RIGHT_TOL, WRONG_MIN, StandIns

GPT_OSS_SRC = Path(__file__).resolve().parents[1] / "gpt_oss" / "fixtures" / "mxfp4"


class FloatStandIns(StandIns):
    """StandIns whose moe_wna16_marlin_gemm reads float Marlin layouts."""

    def gemm(self, a, c, b_qweight, b_bias, b_scales, a_scales, global_scale, b_qzeros,
             workspace, sorted_token_ids, expert_ids, num_tokens_post_padded, topk_weights,
             moe_block_size, top_k, mul_topk_weights, b_q_type, size_m, size_n, size_k,
             *rest, **kw):
        assert a_scales is None and b_qzeros is None
        bits = b_q_type.size_bits
        assert bits in (4, 8) and b_q_type.is_floating_point(), b_q_type
        # NVFP4 only: one F32 processed global scale per expert (the kernel asserts it).
        assert (global_scale is not None) == (b_scales.dtype == torch.float8_e4m3fn)
        self.topk_weights = topk_weights.clone()
        out = torch.zeros(size_m * top_k, size_n)
        n_ids = int(num_tokens_post_padded[0])
        for blk in range(n_ids // moe_block_size):
            e = int(expert_ids[blk])
            ids = sorted_token_ids[blk * moe_block_size:(blk + 1) * moe_block_size].long()
            ids = ids[ids < size_m * top_k]
            key = (b_qweight.data_ptr(), e)
            if key not in self.cache:
                g = None if global_scale is None else global_scale[e]
                self.cache[key] = marlin_float_weight(b_qweight[e], b_scales[e], bits, size_k,
                                                      size_n, a.dtype, g)
            y = a[ids // top_k].float() @ self.cache[key]
            if b_bias is not None:
                # The kernel's epilogue: the expert's bias per output column, added to the scaled
                # product before the top-k weight (gpt-oss; bench/gpu_marlin_float.py's reference
                # topk_w * (x W^T + b) held on vLLM's kernel on the H100).
                y = y + marlin_bias(b_bias[e])
            if mul_topk_weights:
                y = y * topk_weights.flatten()[ids].unsqueeze(1)
            out[ids] = y
        if c is None:
            c = torch.empty(size_m * top_k, size_n, dtype=a.dtype)
        c.view(size_m * top_k, size_n).copy_(out.to(c.dtype))
        return c

    @staticmethod
    def activation(self, activation, output, input, **kw):
        """SILU on [gate | up], or gpt-oss' SWIGLUOAI on interleaved rows (torch.ops._C.
        swigluoai_and_mul: its own alpha 1.702 and limit 7.0, up + 1)."""
        if activation.name != "SWIGLUOAI":
            return StandIns.activation(self, activation, output, input, **kw)
        x = input.float()
        output.copy_(swiglu_oai(x[..., 0::2], x[..., 1::2]).to(output.dtype))


@pytest.fixture
def pretend_ampere(monkeypatch):
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import Fp8MoeBackend, backend_to_kernel_cls

    monkeypatch.setattr(MarlinExperts, "_supports_current_device", staticmethod(lambda: True))
    for backend in (Fp8MoeBackend.CPU, Fp8MoeBackend.CPU_W8A8):
        for cls in backend_to_kernel_cls(backend):
            monkeypatch.setattr(cls, "_supports_current_device", staticmethod(lambda: False))


# synth format -> (convert flags, layout, serving path, builder or vLLM method, synth extras)
CASES = {
    "fp8-block": (("--target-arch", "sm80"), "marlin-fp8", "vllm-method", "Fp8MoEMethod", {}),
    "ct-fp8-block": (("--target-arch", "sm86"), "marlin-fp8", "kernel-builder", "marlin-float",
                     {}),
    # FP8 channel / per-tensor: I padded (96 -> 128) for ModelOpt, w13 requantised by vLLM's rule.
    "ct-fp8-channel": (("--target-arch", "sm80"), "marlin-fp8", "kernel-builder", "marlin-float",
                       {}),
    "ct-fp8-tensor": (("--target-arch", "sm86"), "marlin-fp8", "kernel-builder", "marlin-float",
                      {}),
    "modelopt-fp8": (("--target-arch", "sm80"), "marlin-fp8", "kernel-builder", "marlin-float",
                     {"inter": 96}),
    "modelopt-mxfp8": (("--target-arch", "sm89"), "marlin-mxfp8", "kernel-builder",
                       "marlin-float", {"inter": 96}),
    # FP4 (issue 24): NVFP4 with I padded (96 -> 128), MXFP4 unpadded.
    "modelopt-nvfp4": (("--target-arch", "sm80"), "marlin-nvfp4", "kernel-builder",
                       "marlin-float", {"inter": 96}),
    "ct-nvfp4": (("--target-arch", "sm86"), "marlin-nvfp4", "kernel-builder", "marlin-float", {}),
    "ct-mxfp4": (("--target-arch", "sm89"), "marlin-mxfp4", "kernel-builder", "marlin-float", {}),
    # gpt-oss (issue 26): the published-format fixture (E 4, H = I = 64: vLLM pads to Hp 256,
    # Ip 128), with its biases and swigluoai.
    "gpt-oss": (("--target-arch", "sm80"), "marlin-mxfp4", "kernel-builder", "marlin-float", {}),
}


def param_roles(layout, fmt=""):
    """The roles of a float Marlin layer's parameters (NVFP4: plus its processed global scales;
    gpt-oss: plus its biases)."""
    base = ["w13_scale", "w13_weight", "w2_scale", "w2_weight"]
    if fmt == "gpt-oss":
        return sorted(base + ["w13_bias", "w2_bias"])
    return sorted(base + ["w13_global_scale", "w2_global_scale"]) if layout == "marlin-nvfp4" \
        else base


def ignore_bf16_linears_in(d, nested: bool, field: str) -> None:
    """ignore_bf16_linears for any source block: the BF16 Linears synth writes (dense MLPs,
    attention, router) and vLLM's fused names for them are added to the block's list `field`
    (`ignored_layers` for fp8, `ignore` for compressed-tensors and ModelOpt)."""
    mods = []
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                sl = st.get_slice(k)
                if k.endswith(".weight") and sl.get_dtype() in ("BF16", "F16") and \
                        len(sl.get_shape()) == 2:
                    mods.append(k[:-len(".weight")])
    mods += [re.sub(r"\.(q|k|v)_proj$", ".qkv_proj", m) for m in mods]
    mods += [re.sub(r"\.(gate|up)_proj$", ".gate_up_proj", m) for m in mods]
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    q = cfg["quantization_config"]
    block = q["source_quantization_config"] if nested else q
    block[field] = sorted(set(block.get(field, []) + mods))
    p.write_text(json.dumps(cfg, indent=2))


def swap_gate_up_rows(path: Path) -> None:
    """Exchanges every gate/up row pair (rows 2j and 2j + 1) of a gpt-oss checkpoint's
    gate_up_proj blocks, scales and bias, in place: gate and up exchanged in the source."""
    data = bytearray(path.read_bytes())
    n = struct.unpack("<Q", data[:8])[0]
    size = {"U8": 1, "BF16": 2}
    for name, t in json.loads(data[8:8 + n]).items():
        if name == "__metadata__" or ".gate_up_proj_" not in name:
            continue
        row = size[t["dtype"]]
        for d in t["shape"][2:]:
            row *= d
        b, e = (8 + n + o for o in t["data_offsets"])
        for r in range(b, e, 2 * row):
            data[r:r + row], data[r + row:r + 2 * row] = \
                data[r + row:r + 2 * row], data[r:r + row]
    path.write_bytes(bytes(data))


def gpt_oss_artifact(artifacts, swapped=False):
    """(source, converted) of the tests/gpt_oss fixture; `swapped`: its gate/up-exchanged copy
    converted (the source returned stays the true one)."""
    flags = CASES["gpt-oss"][0]
    if not swapped:
        return GPT_OSS_SRC, artifacts.converted(GPT_OSS_SRC, "gpt-oss", *flags)
    bad = artifacts.root / "gpt-oss-src-gate-up-swapped"
    if not bad.exists():
        import shutil

        shutil.copytree(GPT_OSS_SRC, bad)
        swap_gate_up_rows(bad / "model.safetensors")
    return GPT_OSS_SRC, artifacts.converted(bad, "gpt-oss-gate-up-swapped", *flags)


def artifact(artifacts, fmt):
    if fmt == "gpt-oss":
        return gpt_oss_artifact(artifacts)
    flags, *_, synth = CASES[fmt]
    src, dst = artifacts.get(fmt, "qwen3", *flags, **synth)
    # vLLM's source configs would quantise the BF16 Linears synth writes (dense MLPs, attention,
    # router; synth's ignore lists are partial); config.json only, the tensors stay as converted.
    field = "ignored_layers" if fmt == "fp8-block" else "ignore"
    s, d = artifacts.edited_copy(src, f"mf-{fmt}-src"), artifacts.edited_copy(dst, f"mf-{fmt}-art")
    ignore_bf16_linears_in(s, False, field)
    ignore_bf16_linears_in(d, True, field)
    return s, d


def moepack_layers(model):
    from moepack_vllm.moe import MoepackMoEMethod

    return {n: m for n, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), MoepackMoEMethod)}


@pytest.mark.parametrize("fmt", list(CASES))
def test_float_marlin_exports_its_serving_path(artifacts, fmt):
    _, layout, path, who, _ = CASES[fmt]
    _, dst = artifact(artifacts, fmt)
    m = json.loads((dst / "moepack.json").read_text())
    assert m["backend"] == layout and m["serving"]["path"] == path
    if path == "vllm-method":
        assert (m["serving"]["vllm_method"], m["serving"]["vllm_backend"]) == \
            (who, "Fp8MoeBackend.MARLIN")
    else:
        assert m["serving"]["kernel_builder"] == who
    for L in m["layers"]:
        roles = sorted(L["param_roles"][n] for n in L["params"])
        assert roles == param_roles(layout, fmt)


def run_block(plugin, monkeypatch, src, dst):
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    stand = FloatStandIns(monkeypatch)
    model, cfg = h.load_model(str(dst))
    manifest = json.loads((dst / "moepack.json").read_text())
    L = manifest["layers"][0]
    block = model.get_submodule(L["module"])
    torch.manual_seed(0)
    x = torch.randn(16, L["hidden"]).to(torch.bfloat16)
    with set_current_vllm_config(cfg), set_forward_context(None, cfg, num_tokens=x.shape[0]):
        y = block(x).float()
    return model, manifest, y, x, stand, L["module"] + ".experts"


def gpt_oss_reference(t, prefix, x, topk_ids, topk_weights):
    """gpt-oss' MoE in fp32 from the source (docs/gpt-oss.md "What moepack does with it"): the
    router's logits x W^T + b, top-k, softmax over the k chosen -- checked to be the routing
    vLLM's block took (the same experts; weights to bf16 rounding) -- then per expert
    swigluoai(x gate + b_gate, x up + b_up) down + b_down."""
    block = prefix.removesuffix(".experts")
    logits = x.float() @ t[block + ".router.weight"].float().t() + t[block + ".router.bias"].float()
    top = logits.topk(topk_ids.shape[1], dim=-1)
    weights = torch.softmax(top.values, -1)
    got = topk_ids.long().sort(-1)
    assert torch.equal(top.indices.sort(-1).values, got.values), "vLLM routed other experts"
    mine = weights.gather(1, top.indices.sort(-1).indices)
    theirs = topk_weights.float().gather(1, got.indices)
    assert torch.allclose(mine, theirs, atol=2e-2), (mine, theirs)
    experts = {}
    out = torch.zeros(x.shape[0], x.shape[1])
    for i in range(x.shape[0]):
        xi = x[i].float()
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[i, j])
            if e not in experts:
                experts[e] = gpt_oss_experts(t, prefix + ".", e)
            w = experts[e]
            a = swiglu_oai(xi @ w["gate"] + w["gate_bias"], xi @ w["up"] + w["up_bias"])
            out[i] += float(topk_weights[i, j]) * (a @ w["down"] + w["down_bias"])
    return out


def reference(src, prefix, fmt, x, topk_ids, topk_weights):
    t = {}
    for f in sorted(src.glob("*.safetensors")):
        t.update(load_file(str(f)))
    if fmt == "gpt-oss":
        return gpt_oss_reference(t, prefix, x, topk_ids, topk_weights)
    out = torch.zeros(x.shape[0], x.shape[1])
    for i in range(x.shape[0]):
        for j in range(topk_ids.shape[1]):
            p = f"{prefix}.{int(topk_ids[i, j])}."
            xi = x[i].float()
            if fmt in ("ct-fp8-tensor", "modelopt-fp8"):  # w13 as vLLM requantises it
                gate, up = vllm_per_tensor_gate_up(t, p)
            else:
                gate = source_float_linear(t, p + "gate_proj", fmt)
                up = source_float_linear(t, p + "up_proj", fmt)
            hmid = F.silu(xi @ gate) * (xi @ up)
            out[i] += float(topk_weights[i, j]) * (hmid @ source_float_linear(
                t, p + "down_proj", fmt))
    return out


def forward_error(plugin, monkeypatch, src, dst, fmt):
    model, manifest, y, x, stand, prefix = run_block(plugin, monkeypatch, src, dst)
    ref = reference(src, prefix, fmt, x, stand.topk_ids, stand.topk_weights)
    return model, manifest, float((y - ref).norm() / ref.norm())


@pytest.mark.parametrize("fmt", list(CASES))
def test_float_marlin_serves_and_forward_matches_source(plugin, artifacts, monkeypatch,
                                                        pretend_ampere, fmt):
    from vllm.model_executor.layers.quantization import fp8 as vllm_fp8

    def no_transform(*a, **kw):
        raise AssertionError("vLLM transformed pre-processed weights")

    monkeypatch.setattr(vllm_fp8, "convert_to_fp8_moe_kernel_format", no_transform)
    _, layout, path, who, _ = CASES[fmt]
    src, dst = artifact(artifacts, fmt)
    model, manifest, err = forward_error(plugin, monkeypatch, src, dst, fmt)
    print(f"{fmt} -> {layout}: normalized error {err:.3e}")
    assert err < RIGHT_TOL, f"{fmt}: |y - ref| / |ref| = {err:.3e}"
    assert assert_byte_identical(model, dst) == \
        len(param_roles(layout, fmt)) * len(manifest["layers"])
    layers = moepack_layers(model)
    assert len(layers) == len(manifest["layers"])
    for mod in layers.values():
        q = mod.quant_method
        assert type(q.moe_kernel.fused_experts).__name__ == "MarlinExperts"
        if fmt == "gpt-oss":  # vLLM's runner pads to the parameters' Hp; bias and swigluoai
            L = manifest["layers"][0]
            assert (mod.moe_config.hidden_dim, mod.moe_config.hidden_dim_unpadded) == \
                (256, L["hidden"])
            assert mod.moe_config.intermediate_size_per_partition == L["inter_padded"] == 128
            assert mod.activation.name == "SWIGLUOAI"
            qc = q.moe_quant_config
            assert qc.w1_bias is q.param(mod, "w13_bias") and qc.w2_bias is q.param(mod, "w2_bias")
            assert (qc.gemm1_alpha, qc.gemm1_beta, qc.gemm1_clamp_limit) == (1.702, 1.0, 7.0)
        if path == "vllm-method":
            assert type(q.inner).__name__ == who and q.inner.fp8_backend.name == "MARLIN"
        else:
            assert q.inner is None and q.builder.name == who
            if layout in ("marlin-fp8", "marlin-mxfp8"):
                want = [1, 32] if layout == "marlin-mxfp8" else \
                    None if fmt in ("ct-fp8-channel", "ct-fp8-tensor", "modelopt-fp8") else \
                    [128, 128]
                assert q.builder.block_shape() == want
            assert q.moe_quant_config.w1_scale is q.param(mod, "w13_scale")
            if layout == "marlin-nvfp4":
                assert q.moe_quant_config.g1_alphas is q.param(mod, "w13_global_scale")


def rewrite(d, fn):
    p = d / "model.safetensors"
    tensors = load_file(str(p))
    fn(tensors)
    save_file(tensors, str(p), metadata={"format": "pt"})


def swap_gate_up(t, name):
    """[E, K/16 or G, 2N'] w13 tensor: the halves of its last dimension exchanged."""
    half = t[name].shape[-1] // 2
    t[name] = torch.cat([t[name][..., half:], t[name][..., :half]], -1).contiguous()


@pytest.mark.parametrize("fmt,what", [("modelopt-mxfp8", "gate-up"),
                                      ("modelopt-mxfp8", "pair-swap"),
                                      ("ct-fp8-block", "gate-up"),
                                      ("ct-fp8-channel", "gate-up"),
                                      ("modelopt-fp8", "gate-up"),
                                      ("modelopt-nvfp4", "gate-up"),
                                      ("ct-nvfp4", "global-scale"),
                                      ("ct-mxfp4", "pair-swap")])
def test_float_marlin_forward_catches_corruption(plugin, artifacts, monkeypatch, pretend_ampere,
                                                fmt, what):
    src, dst = artifact(artifacts, fmt)
    d = artifacts.edited_copy(dst, f"mf-bad-{fmt}-{what}")
    manifest = json.loads((d / "moepack.json").read_text())
    roles = {"gate-up": ("w13_weight", "w13_scale"), "pair-swap": ("w13_scale",),
             "global-scale": ("w13_global_scale", "w2_global_scale")}[what]
    names = [n for L in manifest["layers"] for n in L["params"] if L["param_roles"][n] in roles]

    def corrupt(t):
        for n in names:
            if what == "gate-up":
                swap_gate_up(t, n)
            elif what == "global-scale":  # the processed global scale dropped (as 1.0)
                t[n] = torch.ones_like(t[n])
            else:
                b = t[n].view(torch.uint8).reshape(-1, 4)[:, [0, 2, 1, 3]]
                t[n] = b.contiguous().view(t[n].dtype).reshape(t[n].shape)

    rewrite(d, corrupt)
    _, _, err = forward_error(plugin, monkeypatch, src, d, fmt)
    print(f"{fmt} with {what} corrupted: normalized error {err:.3e}")
    assert err > WRONG_MIN, f"a wrong layout passed: {err:.3e}"


# Dropping the tiny gpt-oss' biases moves its MoE by ~0.13 (bench/gpu_marlin_float.py on the H100);
# 0.05 is 2.5x RIGHT_TOL.
WRONG_MIN_BIASES = 0.05


@pytest.mark.parametrize("what", ["gate-up", "biases"])
def test_gpt_oss_forward_catches_corruption(plugin, artifacts, monkeypatch, pretend_ampere,
                                            what):
    """gate and up exchanged in the source (every row pair of gate_up_proj's blocks, scales and
    bias) and converted; or the artifact's biases dropped (zeros): both land far off."""
    src, dst = gpt_oss_artifact(artifacts, swapped=what == "gate-up")
    if what == "biases":
        dst = artifacts.edited_copy(dst, "gpt-oss-bad-biases")
        manifest = json.loads((dst / "moepack.json").read_text())
        names = [n for L in manifest["layers"] for n in L["params"]
                 if L["param_roles"][n] in ("w13_bias", "w2_bias")]
        rewrite(dst, lambda t: t.update({n: torch.zeros_like(t[n]) for n in names}))
    _, _, err = forward_error(plugin, monkeypatch, src, dst, "gpt-oss")
    print(f"gpt-oss with {what} corrupted: normalized error {err:.3e}")
    assert err > (WRONG_MIN_BIASES if what == "biases" else WRONG_MIN), \
        f"a wrong layout passed: {err:.3e}"


def test_path_a_refused_where_vllms_oracle_picks_another_backend(plugin, artifacts):
    """No device stub: vLLM's real FP8 oracle on this CPU machine does not pick MARLIN, so the
    marlin-fp8 artifact is refused by name before anything is loaded."""
    _, dst = artifact(artifacts, "fp8-block")
    with pytest.raises(Exception, match=r"written for Fp8MoeBackend\.MARLIN, but vLLM's oracle "
                                        r"picked"):
        h.load_model(str(dst))


@pytest.mark.parametrize("fmt,cc,served", [
    ("modelopt-nvfp4", 90, False),  # prioritize_humming: stock runs Humming for NVFP4 on Hopper
    ("ct-nvfp4", 89, True),         # Ada: Marlin is stock's pick for NVFP4
    ("ct-mxfp4", 90, True),         # compressed-tensors MXFP4 has no Humming path: Marlin
    ("modelopt-mxfp8", 90, False),  # prioritize_humming: stock runs Humming on Hopper
    ("modelopt-mxfp8", 89, True),   # Ada: Marlin is stock's pick for MXFP8
    ("ct-fp8-block", 90, False),    # Hopper: Triton's FP8 W8A8 first
    ("ct-fp8-block", 89, False),    # Ada has FP8 MMA: Triton before Marlin
    ("ct-fp8-block", 86, True),     # no FP8 MMA: Marlin is stock's pick
    ("ct-fp8-channel", 90, False),  # Hopper: vLLM's CUTLASS FP8 MoE
    ("ct-fp8-channel", 80, True),
    ("modelopt-fp8", 89, False),    # Ada: Triton FP8
    ("ct-fp8-tensor", 100, False),  # Blackwell: FlashInfer
    ("ct-fp8-tensor", 86, True),
    ("gpt-oss", 90, False),         # _get_priority_backends_for_gpt_oss: the OAI Triton kernels
    ("gpt-oss", 100, False),        # FlashInfer's TRT-LLM MXFP4
    ("gpt-oss", 120, True),         # consumer Blackwell: Marlin ahead of Triton
    ("gpt-oss", 89, True),
])
def test_float_marlin_where_stock_runs_a_faster_kernel_is_refused(
        plugin, artifacts, monkeypatch, pretend_ampere, fmt, cc, served):
    """The humming helper's rule for the marlin-float builder: on a GPU where vLLM 0.33's own
    oracle runs another kernel for the source (Humming for MXFP8 on sm90, Triton FP8 for FP8
    block from sm89), the plugin refuses the Marlin artifact unless MOEPACK_VLLM_ALLOW_SLOWER_KERNEL
    is 1; where Marlin is stock's pick it serves it."""
    from moepack_vllm import humming_builder
    from moepack_vllm.moe import ALLOW_SLOWER_ENV

    _, dst = artifact(artifacts, fmt)
    monkeypatch.setattr(humming_builder, "device_sm", lambda: cc)
    monkeypatch.delenv(ALLOW_SLOWER_ENV, raising=False)
    if not served:
        layout = CASES[fmt][1]
        with pytest.raises(Exception, match=rf"layout '{layout}': on this GPU \(sm{cc}\) vLLM "
                                            r"0\.33 runs .* not Marlin"):
            h.load_model(str(dst))
        monkeypatch.setenv(ALLOW_SLOWER_ENV, "1")
    model, _ = h.load_model(str(dst))
    assert assert_byte_identical(model, dst) == \
        len(param_roles(CASES[fmt][1], fmt)) * len(moepack_layers(model))

"""gpt-oss' own-kernel layouts served by the plugin in the real vLLM 0.33.0, on the CPU:
`triton-mxfp4` (Hopper: Mxfp4MoeBackend.TRITON, the OAI Triton kernels) and `trtllm-mxfp4`
(Blackwell: FLASHINFER_TRTLLM_MXFP4_BF16), through the `gpt-oss-triton` / `gpt-oss-trtllm`
kernel builders: vLLM's own GptOssMxfp4MoEMethod (its oracle, maybe_roundup_sizes,
create_weights, get_fused_moe_quant_config, make_mxfp4_moe_kernel, apply_monolithic) with the
conversion replaced by the artifact's bytes (docs/vllm.md "Serving paths").

Byte-identical load: vLLM's own conversion (convert_gpt_oss_weight_to_mxfp4_moe_kernel_format)
runs in the test on the source's layer as vLLM's loader fills it, with the capability faked as
the make_fixtures producers fake it (sm90: vLLM's platform and triton_kernels' capability probe;
sm100: FlashInfer's block-scale interleave on its host path, tests/trtllm_fp4/generate.py); every
object the served layer holds (the triton Tensors with their layouts, storages and bytes, the
PrecisionConfigs, the float32 biases; TRT-LLM: the parameters) equals it.

Forward: vLLM's whole gpt-oss MoE block (router with bias, runner, monolithic experts) with the
kernel call replaced by a CPU function reading the same objects the kernel gets (Triton:
triton_kernel_moe_forward, the weights unswizzled by triton_kernels' own layouts; TRT-LLM:
flashinfer.trtllm_fp4_block_scale_moe, the rows and 128x4 scales undone as docs/trtllm_fp4.md
defines them) against the fp32 MoE of the source checkpoint; gate/up exchanged in the source and
the biases dropped must fail.

Stubbed, because they need the GPU, and nothing else: the experts' `_supports_current_device`
(OAITritonMxfp4ExpertsMonolithic / TrtLlmMxfp4ExpertsMonolithic -> True; the oracle is vLLM's)
and, for TRT-LLM, torch.accelerator.current_device_index -> the CPU (its constructor puts its
per-expert constants on the device it asks for).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import vllm_harness as h
from layouts import trtllm_bias, trtllm_mxfp4_dense, triton_mxfp4_dense
from serving_record import swiglu_oai
from test_serving_forward import RIGHT_TOL, WRONG_MIN
from test_serving_marlin_float import (GPT_OSS_SRC, WRONG_MIN_BIASES, gpt_oss_artifact,
                                       gpt_oss_reference, moepack_layers, pretend_ampere,
                                       swap_gate_up_rows)

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINT = ROOT / "bench" / "gpt_oss_checkpoint.py"
# layout -> (convert flags, kernel builder, vLLM backend, source shape for gpt_oss_checkpoint.py:
# experts, hidden, inter, layers; None: tests/gpt_oss' published-format fixture, E 4 H = I = 64)
CASES = {
    # E 4 H 256 I 96: I padded to Ip 128 (64-aligned), 8 scale groups, top-2 of 4.
    "triton-mxfp4": (("--target-arch", "sm90"), "gpt-oss-triton", "TRITON", (4, 256, 96, 2)),
    # H = I = 64 padded to Hp 256, Ip 128.
    "trtllm-mxfp4": (("--target-arch", "sm100"), "gpt-oss-trtllm",
                     "FLASHINFER_TRTLLM_MXFP4_BF16", None),
}
ROLES = ["w13_bias", "w13_scale", "w13_weight", "w2_bias", "w2_scale", "w2_weight"]


def source(artifacts, layout, swapped=False):
    """The gpt-oss checkpoint a case converts (`swapped`: gate and up exchanged in it)."""
    shape = CASES[layout][3]
    if shape is None:
        src = GPT_OSS_SRC
    else:
        src = artifacts.root / ("gpt-oss-src-%d-%d-%d-%d" % shape)
        if not src.exists():
            E, H, I, L = shape
            subprocess.run([sys.executable, str(CHECKPOINT), str(src), "--experts", str(E),
                            "--hidden", str(H), "--inter", str(I), "--layers", str(L),
                            "--top-k", "2", "--seed", "26", "--vocab", "256"], check=True,
                           stdout=subprocess.DEVNULL)
    if not swapped:
        return src
    bad = artifacts.root / f"{src.name}-gate-up-swapped"
    if not bad.exists():
        import shutil

        shutil.copytree(src, bad)
        swap_gate_up_rows(bad / "model.safetensors")
    return bad


def artifact(artifacts, layout, swapped=False):
    src = source(artifacts, layout, swapped)
    dst = artifacts.converted(src, f"{src.name}-{layout}", *CASES[layout][0])
    return source(artifacts, layout), dst


@pytest.fixture
def pretend_hopper(monkeypatch):
    from vllm.model_executor.layers.fused_moe.experts.gpt_oss_triton_kernels_moe import (
        OAITritonExperts,
        OAITritonMxfp4ExpertsMonolithic,
    )

    for cls in (OAITritonMxfp4ExpertsMonolithic, OAITritonExperts):
        monkeypatch.setattr(cls, "_supports_current_device", staticmethod(lambda: True))


@pytest.fixture
def pretend_blackwell(monkeypatch):
    from vllm.model_executor.layers.fused_moe.experts.trtllm_mxfp4_moe import (
        TrtLlmMxfp4ExpertsMonolithic,
        TrtLlmMxfp4ExpertsModular,
    )

    for cls in (TrtLlmMxfp4ExpertsMonolithic, TrtLlmMxfp4ExpertsModular):
        monkeypatch.setattr(cls, "_supports_current_device", staticmethod(lambda: True))
    # TrtLlmMxfp4ExpertsBase.__init__ puts its per-expert alpha / beta / limit on the device it
    # asks for: here the CPU (this machine has no CUDA driver).
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: "cpu")


PRETEND = {"triton-mxfp4": "pretend_hopper", "trtllm-mxfp4": "pretend_blackwell"}


# ---- vLLM's own conversion of the source, in the test ----

def loaded_layer(t, prefix, backend):
    """GptOssMxfp4MoEMethod.create_weights' zero parameters on the sizes vLLM rounds to, the
    source copied into their leading rows / columns (the gpt-oss loader's gpt_oss_mxfp4 branch,
    TP 1): what vLLM's conversion starts from."""
    from vllm.model_executor.layers.fused_moe.oracle.mxfp4 import (
        mxfp4_round_up_hidden_size_and_intermediate_size,
    )

    b13 = t[prefix + "gate_up_proj_blocks"]
    E, two_i, H = b13.shape[0], b13.shape[1], b13.shape[2] * 32
    I = two_i // 2
    Hp, Ip = mxfp4_round_up_hidden_size_and_intermediate_size(backend, H, I)
    out = {"w13_weight": torch.zeros(E, 2 * Ip, Hp // 2, dtype=torch.uint8),
           "w13_weight_scale": torch.zeros(E, 2 * Ip, Hp // 32, dtype=torch.uint8),
           "w13_bias": torch.zeros(E, 2 * Ip, dtype=torch.bfloat16),
           "w2_weight": torch.zeros(E, Hp, Ip // 2, dtype=torch.uint8),
           "w2_weight_scale": torch.zeros(E, Hp, Ip // 32, dtype=torch.uint8),
           "w2_bias": torch.zeros(E, Hp, dtype=torch.bfloat16)}
    out["w13_weight"][:, :2 * I, :H // 2] = b13.reshape(E, 2 * I, H // 2)
    out["w13_weight_scale"][:, :2 * I, :H // 32] = t[prefix + "gate_up_proj_scales"]
    out["w13_bias"][:, :2 * I] = t[prefix + "gate_up_proj_bias"]
    out["w2_weight"][:, :H, :I // 2] = t[prefix + "down_proj_blocks"].reshape(E, H, I // 2)
    out["w2_weight_scale"][:, :H, :I // 32] = t[prefix + "down_proj_scales"]
    out["w2_bias"][:, :H] = t[prefix + "down_proj_bias"]
    return out


def fake_sm90(monkeypatch):
    """vLLM's platform and triton_kernels answer as an sm90 CUDA GPU (as tests/golden/
    triton_mxfp4/make_fixtures.py does), for the conversion only."""
    from vllm.platforms import current_platform as p
    import triton_kernels.target_info as ti
    import triton_kernels.tensor_details.layout as layout

    for name, fn in (("is_cuda", lambda: True), ("is_rocm", lambda: False),
                     ("is_xpu", lambda: False), ("is_cpu", lambda: False),
                     ("is_device_capability", lambda cap, *a, **k: cap in (90, (9, 0))),
                     ("is_device_capability_family", lambda cap, *a, **k: cap == 90)):
        monkeypatch.setattr(p, name, fn)
    geq = lambda major, minor=0: (9, 0) >= (major, minor)  # noqa: E731
    monkeypatch.setattr(ti, "cuda_capability_geq", geq)
    monkeypatch.setattr(layout, "cuda_capability_geq", geq)
    monkeypatch.setattr(layout, "is_hip_cdna4", lambda: False)


def flashinfer_interleave_on_host(monkeypatch):
    """FlashInfer's nvfp4_block_scale_interleave asks the CUDA device for its arch; the op it
    wraps (block_scale_interleave_sm100 of the fp4_quantization_100 JIT module, built for 10.0a)
    takes CPU tensors on its host path (tests/trtllm_fp4/generate.py)."""
    monkeypatch.setenv("FLASHINFER_CUDA_ARCH_LIST", "10.0a")
    import flashinfer.fp4_quantization as fi_fp4
    from flashinfer.quantization.fp4_quantization import (
        gen_fp4_quantization_sm100_module,
        get_fp4_quantization_module,
    )

    if not gen_fp4_quantization_sm100_module().is_compiled:
        # Building it takes ~9 minutes on 2 cores, beyond this suite's budget; generate.py does.
        pytest.skip("FlashInfer's fp4_quantization_100 JIT module is not built on this machine "
                    "(run tests/trtllm_fp4/generate.py once)")
    module = get_fp4_quantization_module("100")
    monkeypatch.setattr(fi_fp4, "nvfp4_block_scale_interleave",
                        lambda sf: module.block_scale_interleave_sm100(sf.contiguous()))


def vllm_conversion(monkeypatch, src, prefix, layout):
    """vLLM 0.33's own convert_gpt_oss_weight_to_mxfp4_moe_kernel_format on the source layer."""
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    backend = oracle.Mxfp4MoeBackend[CASES[layout][2]]
    t = {}
    for f in sorted(src.glob("*.safetensors")):
        t.update(load_file(str(f)))
    p = loaded_layer(t, prefix + ".", backend)
    layer = torch.nn.Module()
    for n in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
        layer.register_parameter(n, torch.nn.Parameter(p[n], requires_grad=False))
    with monkeypatch.context() as m:
        if layout == "triton-mxfp4":
            fake_sm90(m)
        else:
            flashinfer_interleave_on_host(m)
        return oracle.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format(
            mxfp4_backend=backend, layer=layer, w13_weight=p["w13_weight"],
            w2_weight=p["w2_weight"], w13_weight_scale=p["w13_weight_scale"],
            w2_weight_scale=p["w2_weight_scale"], w13_bias=p["w13_bias"], w2_bias=p["w2_bias"],
            _cache_permute_indices={})


def tensor_desc(t):
    """A triton_kernels Tensor as the kernel sees it, its bytes aside."""
    st = t.storage
    fields = {k: list(v) if isinstance(v, (list, tuple, torch.Size)) else v
              for k, v in vars(st.layout).items()}
    return (type(t).__name__, str(t.dtype), [int(x) for x in t.shape], list(t.shape_max),
            type(st.layout).__name__, fields, list(st.data.shape), st.data.stride(),
            st.data.dtype)


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ---- the tests ----

@pytest.mark.parametrize("layout", list(CASES))
def test_exports_its_kernel_builder(artifacts, layout):
    _, dst = artifact(artifacts, layout)
    m = json.loads((dst / "moepack.json").read_text())
    assert (m["backend"], m["source"]["format"]) == (layout, "gpt-oss-mxfp4")
    assert m["serving"]["path"] == "kernel-builder"
    assert m["serving"]["kernel_builder"] == CASES[layout][1]
    for L in m["layers"]:
        assert sorted(L["param_roles"][n] for n in L["params"]) == ROLES


@pytest.mark.parametrize("layout", list(CASES))
def test_loads_exactly_what_vllms_own_conversion_leaves(plugin, artifacts, monkeypatch, request,
                                                         layout):
    request.getfixturevalue(PRETEND[layout])
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4 as oracle

    calls = []
    real = oracle.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format
    monkeypatch.setattr(oracle, "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    src, dst = artifact(artifacts, layout)
    model, _ = h.load_model(str(dst))
    assert not calls, "vLLM converted the pre-converted layer"
    manifest = json.loads((dst / "moepack.json").read_text())
    layers = moepack_layers(model)
    assert len(layers) == len(manifest["layers"]) == 2
    for L in manifest["layers"]:
        mod = next(m for n, m in layers.items() if n.startswith(L["module"] + "."))
        q = mod.quant_method
        inner = q.builder.vllm_method
        assert q.inner is None and q.builder.name == CASES[layout][1]
        assert type(inner).__name__ == "GptOssMxfp4MoEMethod"
        assert inner.mxfp4_backend.name == CASES[layout][2]
        w13, w2, s13, s2, b13, b2 = vllm_conversion(monkeypatch, src, L["module"] + ".experts",
                                                    layout)
        assert same_bytes(mod.w13_bias.data, b13) and same_bytes(mod.w2_bias.data, b2)
        if layout == "triton-mxfp4":
            # vLLM deletes the four parameters: the Tensors live on the layer and the method.
            assert sorted(n for n, _ in mod.named_parameters(recurse=False)) == \
                ["w13_bias", "w2_bias"]
            for got, want in ((mod.w13_weight, w13), (mod.w2_weight, w2),
                              (inner.w13_precision_config.weight_scale, s13.weight_scale),
                              (inner.w2_precision_config.weight_scale, s2.weight_scale)):
                assert tensor_desc(got) == tensor_desc(want)
                assert torch.equal(got.storage.data, want.storage.data)
            for got, want in ((inner.w13_precision_config, s13),
                              (inner.w2_precision_config, s2)):
                assert {k: repr(v) for k, v in vars(got).items() if k != "weight_scale"} == \
                    {k: repr(v) for k, v in vars(want).items() if k != "weight_scale"}
            qc = q.moe_quant_config
            assert qc.w1_precision is inner.w13_precision_config
            assert type(q.moe_kernel.fused_experts).__name__ == "OAITritonMxfp4ExpertsMonolithic"
        else:
            for n, want in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", s13),
                            ("w2_weight_scale", s2)):
                assert same_bytes(getattr(mod, n).data, want), n
            qc = q.moe_quant_config
            assert qc.w1_scale is mod.w13_weight_scale and qc.w2_scale is mod.w2_weight_scale
            assert type(q.moe_kernel.fused_experts).__name__ == "TrtLlmMxfp4ExpertsMonolithic"
            assert mod.moe_config.hidden_dim == 256  # the runner pads H = 64 to Hp
        assert qc.w1_bias is mod.w13_bias and qc.w2_bias is mod.w2_bias
        assert (qc.gemm1_alpha, qc.gemm1_beta, qc.gemm1_clamp_limit) == (1.702, 1.0, 7.0)
        assert q.moe_kernel is inner.moe_kernel and q.is_monolithic


class TritonStandIn:
    """vLLM's triton_kernel_moe_forward on the CPU, from the objects the kernel gets: top-k of
    the router logits then softmax over the k (renormalize), per expert x W1 + b1 on the
    interleaved rows (even gate, odd up), swigluoai, the bf16 intermediate, W2 + b2."""

    def __init__(self):
        self.topk_ids = self.topk_weights = None

    def __call__(self, hidden_states, w1, w2, gating_output, topk, renormalize, activation=None,
                 quant_config=None, apply_router_weight_on_input=False, global_num_experts=-1,
                 expert_map=None, **kw):
        assert renormalize and expert_map is None and not apply_router_weight_on_input
        assert quant_config.w1_bias.dtype == torch.float32
        W1 = triton_mxfp4_dense(w1, quant_config.w1_precision)  # [E, H, 2Ip]
        W2 = triton_mxfp4_dense(w2, quant_config.w2_precision)  # [E, Ip, H]
        b1, b2 = quant_config.w1_bias, quant_config.w2_bias
        top = gating_output.float().topk(topk, dim=-1)
        wts = torch.softmax(top.values, dim=-1)
        self.topk_ids, self.topk_weights = top.indices, wts
        x = hidden_states.float()
        out = torch.zeros(x.shape[0], W2.shape[2])
        for j in range(topk):
            e = top.indices[:, j]
            hmid = torch.einsum("mk,mkn->mn", x, W1[e]) + b1[e]
            a = swiglu_oai(hmid[:, 0::2], hmid[:, 1::2]).to(torch.bfloat16).float()
            out += wts[:, j:j + 1] * (torch.einsum("mk,mkn->mn", a, W2[e]) + b2[e])
        return out.to(hidden_states.dtype)


class TrtllmStandIn:
    """flashinfer.trtllm_fp4_block_scale_moe on the CPU, from its arguments: the shuffled MXFP4
    weights and 128x4 E8M0 scales decoded back to pre-shuffle rows (w13: up j at row 2j, gate j
    at 2j + 1, TRT-LLM's SwiGLU order), float32 biases, its per-expert alpha / beta / limit;
    top-k of the logits then softmax over the k (Renormalize)."""

    def __init__(self):
        self.topk_ids = self.topk_weights = None

    def __call__(self, routing_logits, routing_bias, hidden_states, hidden_states_scale,
                 gemm1_weights, gemm1_weights_scale, gemm1_bias, gemm1_alpha, gemm1_beta,
                 gemm1_clamp_limit, gemm2_weights, gemm2_weights_scale, gemm2_bias, num_experts,
                 top_k, intermediate_size, routing_method_type, output=None, do_finalize=True,
                 local_expert_offset=0, local_num_experts=None, **kw):
        assert routing_bias is None and hidden_states_scale is None and do_finalize
        assert routing_method_type.name in ("Renormalize", "RenormalizeNaive")
        Hp = hidden_states.shape[1]
        W1 = trtllm_mxfp4_dense(gemm1_weights, gemm1_weights_scale, Hp)  # [E, 2Ip, Hp]
        W2 = trtllm_mxfp4_dense(gemm2_weights, gemm2_weights_scale, intermediate_size)
        b1, b2 = trtllm_bias(gemm1_bias), trtllm_bias(gemm2_bias)
        top = routing_logits.float().topk(top_k, dim=-1)
        wts = torch.softmax(top.values, dim=-1)
        self.topk_ids, self.topk_weights = top.indices, wts
        x = hidden_states.float()
        y = torch.zeros(x.shape[0], W2.shape[1])
        for j in range(top_k):
            e = top.indices[:, j]
            hmid = torch.einsum("mk,mnk->mn", x, W1[e]) + b1[e]
            alpha, beta, limit = (float(t[0]) for t in (gemm1_alpha, gemm1_beta,
                                                        gemm1_clamp_limit))
            gate = hmid[:, 1::2].clamp(max=limit)
            up = hmid[:, 0::2].clamp(-limit, limit)
            a = (gate * torch.sigmoid(alpha * gate) * (up + beta)).to(torch.bfloat16).float()
            y += wts[:, j:j + 1] * (torch.einsum("mk,mnk->mn", a, W2[e]) + b2[e])
        assert output is not None  # vLLM passes its finalized output ([T, H], unpadded)
        output.copy_(y[:, :output.shape[1]].to(output.dtype))
        return [output]


def run_block(monkeypatch, dst, layout):
    """vLLM's gpt-oss MoE block of layer 0 on 16 random bf16 tokens, the kernel call replaced."""
    from vllm.config import set_current_vllm_config
    from vllm.forward_context import set_forward_context

    if layout == "triton-mxfp4":
        from vllm.model_executor.layers.fused_moe.experts import gpt_oss_triton_kernels_moe as k

        stand = TritonStandIn()
        monkeypatch.setattr(k, "triton_kernel_moe_forward", stand)
    else:
        import flashinfer

        stand = TrtllmStandIn()
        monkeypatch.setattr(flashinfer, "trtllm_fp4_block_scale_moe", stand)
    model, cfg = h.load_model(str(dst))
    L = json.loads((dst / "moepack.json").read_text())["layers"][0]
    block = model.get_submodule(L["module"])
    torch.manual_seed(0)
    # Scaled so that the router's logits stay small: vLLM rounds them to bf16, the reference
    # recomputes them in fp32 and checks the routing weights to 2e-2.
    x = (0.25 * torch.randn(16, L["hidden"])).to(torch.bfloat16)
    with set_current_vllm_config(cfg), set_forward_context(None, cfg, num_tokens=x.shape[0]):
        y = block(x).float()
    assert stand.topk_ids is not None, "the kernel stand-in was not called"
    return y, x, stand, L["module"] + ".experts"


def forward_error(monkeypatch, src, dst, layout):
    y, x, stand, prefix = run_block(monkeypatch, dst, layout)
    t = {}
    for f in sorted(src.glob("*.safetensors")):
        t.update(load_file(str(f)))
    ref = gpt_oss_reference(t, prefix, x, stand.topk_ids, stand.topk_weights)
    return float((y - ref).norm() / ref.norm())


@pytest.mark.parametrize("layout", list(CASES))
def test_forward_matches_source(plugin, artifacts, monkeypatch, request, layout):
    request.getfixturevalue(PRETEND[layout])
    src, dst = artifact(artifacts, layout)
    err = forward_error(monkeypatch, src, dst, layout)
    print(f"gpt-oss {layout}: normalized error {err:.3e}")
    assert err < RIGHT_TOL, f"|y - ref| / |ref| = {err:.3e}"


@pytest.mark.parametrize("layout,what", [(lay, w) for lay in CASES
                                         for w in ("gate-up", "biases")])
def test_forward_catches_corruption(plugin, artifacts, monkeypatch, request, layout, what):
    """gate and up exchanged in the source (every row pair of gate_up_proj) and converted, or
    the artifact's biases dropped (zeros): both land far off."""
    request.getfixturevalue(PRETEND[layout])
    src, dst = artifact(artifacts, layout, swapped=what == "gate-up")
    if what == "biases":
        dst = artifacts.edited_copy(dst, f"gpt-oss-{layout}-no-biases")
        manifest = json.loads((dst / "moepack.json").read_text())
        names = [n for L in manifest["layers"] for n in L["params"]
                 if L["param_roles"][n] in ("w13_bias", "w2_bias")]
        for f in dst.glob("*.safetensors"):
            t = load_file(str(f))
            t.update({n: torch.zeros_like(t[n]) for n in names if n in t})
            save_file(t, str(f), metadata={"format": "pt"})
    err = forward_error(monkeypatch, src, dst, layout)
    print(f"gpt-oss {layout} with {what} corrupted: normalized error {err:.3e}")
    assert err > (WRONG_MIN_BIASES if what == "biases" else WRONG_MIN), \
        f"a wrong layout passed: {err:.3e}"


@pytest.mark.parametrize("layout,gpu,picks,hint", [
    ("triton-mxfp4", "pretend_blackwell", "FLASHINFER_TRTLLM_MXFP4_BF16",
     r"re-convert the source to trtllm-mxfp4 \(moepack convert --target-arch sm100\)"),
    ("trtllm-mxfp4", "pretend_hopper", "TRITON",
     r"re-convert the source to triton-mxfp4 \(moepack convert --target-arch sm90\)"),
])
def test_refused_where_vllm_runs_another_backend(plugin, artifacts, request, layout, gpu, picks,
                                                 hint):
    """The oracle is vLLM's: on a GPU where it picks another backend for gpt-oss the artifact
    is refused before anything loads, naming both backends and the layout to convert to."""
    request.getfixturevalue(gpu)
    _, dst = artifact(artifacts, layout)
    with pytest.raises(Exception, match=rf"layout '{layout}' is written for Mxfp4MoeBackend\."
                                        rf"{CASES[layout][2]}, but on this GPU vLLM 0\.33's "
                                        rf"oracle picks Mxfp4MoeBackend\.{picks} .*{hint}"):
        h.load_model(str(dst))


@pytest.mark.parametrize("layout", list(CASES))
def test_refused_without_the_gpu(plugin, artifacts, layout):
    """No stub: vLLM's real oracle on this CPU machine picks no GPU backend for gpt-oss."""
    _, dst = artifact(artifacts, layout)
    with pytest.raises(Exception, match=rf"layout '{layout}' is written for Mxfp4MoeBackend\."
                                        rf"{CASES[layout][2]}, but"):
        h.load_model(str(dst))


def test_wrapping_refuses_a_buffer_of_another_shape():
    """The wrapping names the buffer whose shape does not follow from H and Ip."""
    from moepack_vllm.triton_mxfp4 import TritonMxfp4Error, wrap_triton_mxfp4

    E, H, Ip = 2, 256, 128
    ok = dict(w13_weight=torch.zeros(E, 2 * Ip // 4, 4 * 128, dtype=torch.uint8),
              w2_weight=torch.zeros(E, H // 4, 4 * 64, dtype=torch.uint8),
              w13_scale=torch.zeros(E, 256 // 32, 32 * 8, dtype=torch.uint8),
              w2_scale=torch.zeros(E, 256 // 32, 32 * 4, dtype=torch.uint8))
    wrap_triton_mxfp4(**ok, hidden=H, inter_padded=Ip)
    bad = dict(ok, w2_scale=torch.zeros(E, 256 // 32, 32 * 8, dtype=torch.uint8))
    with pytest.raises(TritonMxfp4Error, match=r"w2 scale: torch.uint8 \[2, 8, 256\], a "
                                               r"triton-mxfp4 layer holds torch.uint8 "
                                               r"\[2, 8, 128\]"):
        wrap_triton_mxfp4(**bad, hidden=H, inter_padded=Ip)
    with pytest.raises(TritonMxfp4Error, match="not padded to 64"):
        wrap_triton_mxfp4(**ok, hidden=H, inter_padded=96)


@pytest.mark.parametrize("cc,layout", [(90, "triton-mxfp4"), (100, "trtllm-mxfp4")])
def test_marlin_artifact_refusal_names_the_layout_to_convert_to(plugin, artifacts, monkeypatch,
                                                                pretend_ampere, cc, layout):
    """A gpt-oss marlin-mxfp4 artifact on sm90 / sm100, where vLLM runs TRITON / TRT-LLM MXFP4:
    refused (unless MOEPACK_VLLM_ALLOW_SLOWER_KERNEL=1), naming the layout this plugin serves
    there."""
    from moepack_vllm import humming_builder
    from moepack_vllm.moe import ALLOW_SLOWER_ENV

    _, dst = gpt_oss_artifact(artifacts)
    monkeypatch.setattr(humming_builder, "device_sm", lambda: cc)
    monkeypatch.delenv(ALLOW_SLOWER_ENV, raising=False)
    with pytest.raises(Exception, match=rf"layout 'marlin-mxfp4': on this GPU \(sm{cc}\) vLLM "
                                        rf"0\.33 runs Mxfp4MoeBackend\.\w+ for gpt-oss, not "
                                        rf"Marlin's .*re-convert the source to {layout} "
                                        rf"\(moepack convert --target-arch sm{cc}\), which "
                                        r"this plugin serves"):
        h.load_model(str(dst))

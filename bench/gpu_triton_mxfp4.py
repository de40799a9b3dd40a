#!/usr/bin/env python3
"""triton-mxfp4 on the H100 (bench/gpu_triton_mxfp4.sh): vLLM 0.33.0's own Triton MXFP4
conversion run on the GPU, compared byte for byte with moepack's output and with the committed
CPU fixtures, and the OAI Triton kernel (matmul_ogs) run on moepack's bytes against an fp32
reference.

No vLLM on the device: the carry holds vLLM 0.33.0's vendored triton_kernels/ and its
oracle/mxfp4.py and quantization/utils/mxfp4_utils.py (SHA-256 checked against the fixtures'
records). The functions that convert gpt-oss for TRITON (Mxfp4MoeBackend,
mxfp4_round_up_hidden_size_and_intermediate_size, convert_gpt_oss_weight_to_mxfp4_moe_kernel_format,
_swizzle_mxfp4, mx_scale_kwargs and the backend tuples) are taken from those files' ASTs and
executed as written, with vLLM's platform answered by the real GPU (torch.cuda capability).

Per case (a gpt-oss checkpoint SRC and moepack's `convert --target-arch sm90` of it, OUT):
  bytes     vLLM's w13/w2 weight and scale storage (as the contiguous buffers .mT) and float32
            biases == OUT's parameters, every layer
  kernel    matmul_ogs (batched, with the bias) on OUT's bytes placed in vLLM's triton Tensors,
            bf16 activations, against x @ W^T + b in fp32 from the checkpoint's decoded codes
            (both projections); norm error = max|y - ref| / max|ref| must be < 2e-2
  mutants   the same kernel check must FAIL with the gate/up rows of the reference exchanged,
            and with OUT's value bytes left unswizzled (plain [rows, K/2] bytes)
  plugin    the plugin's own wrapping (integrations/vllm/moepack_vllm/triton_mxfp4.py, imported
            without vLLM) of OUT's bytes: the triton Tensors and PrecisionConfigs must equal vLLM's
            (layouts and their fields, dtypes, logical shapes, storage views and bytes); matmul_ogs
            through them per projection, and the whole MoE through vLLM's own
            triton_kernel_moe_forward (its legacy-API routing, matmul_ogs with the fused swiglu and
            the scatter; taken from the carried gpt_oss_triton_kernels_moe.py like the conversion)
            on bf16 tokens routed by the source's router, against an fp32 gpt-oss MoE from the
            checkpoint (top-k of the logits, softmax over the k, biases, clamped swiglu on the
            interleaved rows): norm error ||y - ref|| / ||ref|| < 2e-2; biases dropped and gate/up
            exchanged in the reference must exceed it
And each committed fixture (tests/golden/triton_mxfp4) recomputed by vLLM's code on the GPU must
equal its bytes (the CPU run faked an sm90; this one is one), the kernel-refused ones included.
"""
import argparse
import ast
import enum
import glob
import hashlib
import json
import os
import sys
import traceback
from typing import Any, Union

import torch

DEV = "cuda"  # --cpu-selftest: "cpu", capability faked as sm90, no kernel (checks this script)
LUT = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                    -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


DTYPES = {"U8": torch.uint8, "BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16,
          "I32": torch.int32, "F8_E8M0": torch.uint8}


class SafeTensors:
    """A safetensors file's tensors (no safetensors package on the device)."""

    def __init__(self, path):
        import struct
        raw = open(path, "rb").read()
        n = struct.unpack("<Q", raw[:8])[0]
        self.header = {k: v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
        self.data = bytearray(raw[8 + n:])

    def keys(self):
        return list(self.header)

    def get_tensor(self, name):
        h = self.header[name]
        a, b = h["data_offsets"]
        t = torch.frombuffer(self.data, dtype=torch.uint8, count=b - a, offset=a) if b > a else \
            torch.empty(0, dtype=torch.uint8)
        return t.view(DTYPES[h["dtype"]]).reshape(h["shape"]).clone()


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


class Platform:
    """vLLM's current_platform as the GPU present answers it."""

    def is_cuda(self):
        return True

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cpu(self):
        return False

    def _cap(self):
        if DEV == "cpu":
            return 90
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor

    def is_device_capability(self, cap):
        return self._cap() == cap

    def is_device_capability_family(self, cap):
        return self._cap() // 10 == cap // 10


class MoEActivation(enum.Enum):
    """Only annotated (and compared against on ROCm) by the functions taken from vLLM."""
    SITU = "situ"
    SILU = "silu"
    SWIGLUOAI = "swigluoai"


class Log:
    def warning_once(self, *a, **k):
        print("vllm warning:", a[0] if a else "")

    def info_once(self, *a, **k):
        pass

    debug_once = info_once


def load_vllm(carry):
    """Executes vLLM 0.33.0's TRITON conversion functions from the carried source files."""
    import triton_kernels  # noqa: F401  (the carried vendored package, top level)
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
    # The plugin's reading of the API generation, vLLM's get_triton_kernels_version's rule.
    from moepack_vllm.triton_mxfp4 import triton_kernels_api

    def torch_geq(v):
        def parts(x):
            return tuple(int("".join(c for c in p if c.isdigit()) or 0)
                         for p in x.split("+")[0].split(".")[:3])
        return parts(torch.__version__) >= parts(v)

    ns = {"torch": torch, "Any": Any, "Union": Union, "Enum": enum.Enum, "logger": Log(),
          "current_platform": Platform(), "has_triton_kernels": lambda: True,
          "get_triton_kernels_version": triton_kernels_api, "is_torch_equal_or_newer": torch_geq,
          "should_use_gfx1250_mx_scale_swizzle": lambda: False,
          "should_use_cdna4_mx_scale_swizzle": lambda: False,
          "round_up": lambda x, y: (x + y - 1) // y * y, "OCP_MX_BLOCK_SIZE": 32,
          "PrecisionConfig": PrecisionConfig, "FlexCtx": FlexCtx, "MoEActivation": MoEActivation}
    utils = open(os.path.join(carry, "vllm_src", "mxfp4_utils.py")).read()
    oracle = open(os.path.join(carry, "vllm_src", "oracle_mxfp4.py")).read()
    want_fn = {"_swizzle_mxfp4", "mx_scale_kwargs", "mxfp4_round_up_hidden_size_and_intermediate_size",
               "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format"}
    for src in (utils, oracle):
        tree = ast.parse(src)
        for node in tree.body:
            keep = (isinstance(node, ast.ClassDef) and node.name == "Mxfp4MoeBackend") or (
                isinstance(node, ast.FunctionDef) and node.name in want_fn) or (
                isinstance(node, ast.Assign) and len(node.targets) == 1 and
                isinstance(node.targets[0], ast.Name) and node.targets[0].id.endswith("_BACKENDS"))
            if keep:
                exec(compile(ast.Module(body=[node], type_ignores=[]), "<vllm>", "exec"), ns)
    ns["_mx_scale_kwargs"] = ns["mx_scale_kwargs"]
    return ns


def load_vllm_forward(carry):
    """vLLM 0.33.0's triton_kernel_moe_forward and triton_kernel_fused_experts (the OAI Triton
    experts' path, experts/gpt_oss_triton_kernels_moe.py) executed from the carried source, with
    the names they use bound to the carried triton_kernels (API 3.5.1) and to small stand-ins for
    vLLM's helpers: _resize_cache (fused_moe/utils.py: a view of the cache's first elements), the
    sm12x block-m constraint (a no-op on sm90), the quant config's class (annotations only)."""
    import math
    import triton_kernels
    import triton_kernels.swiglu  # noqa: F401  (swiglu_fn, read as triton_kernels.swiglu)
    from triton_kernels.matmul_ogs import (FnSpecs, FusedActivation, GatherIndx, RoutingData,
                                           ScatterIndx, matmul_ogs)

    class FusedMoEQuantConfig:  # noqa: D401  (annotations only)
        pass

    def resize_cache(x, v):
        assert math.prod(v) <= x.numel()
        return x.flatten()[: math.prod(v)].view(*v)

    def unused(*a, **k):
        raise AssertionError("not on the sm90 / API 3.5.1 / no-expert-map path")

    ns = {"torch": torch, "triton_kernels": triton_kernels, "MoEActivation": MoEActivation,
          "FusedMoEQuantConfig": FusedMoEQuantConfig, "FUSED_MOE_UNQUANTIZED_CONFIG": None,
          "triton_kernels_version": "3.5.1", "_resize_cache": resize_cache,
          "_constrain_sm12x_block_m": lambda *a: None, "make_routing_data": unused,
          "routing_data_from_sparse_topk": unused, "FnSpecs": FnSpecs,
          "FusedActivation": FusedActivation, "GatherIndx": GatherIndx,
          "RoutingData": RoutingData, "ScatterIndx": ScatterIndx, "matmul_ogs": matmul_ogs}
    src = open(os.path.join(carry, "vllm_src", "gpt_oss_triton_kernels_moe.py")).read()
    want = {"triton_kernel_moe_forward", "triton_kernel_fused_experts"}
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef) and node.name in want:
            exec(compile(ast.Module(body=[node], type_ignores=[]), "<vllm>", "exec"), ns)
    assert want <= set(ns), "the carried gpt_oss_triton_kernels_moe.py lacks " + str(want - set(ns))
    return ns


def storage_buf(t):
    buf = t.storage.data.mT
    assert buf.is_contiguous()
    return buf


def first_diff(a, b):
    a, b = a.flatten().view(torch.uint8), b.flatten().view(torch.uint8)
    if a.numel() != b.numel():
        return f"sizes {a.numel()} vs {b.numel()}"
    d = (a != b).nonzero()
    return None if d.numel() == 0 else f"{d.numel()} bytes differ, first at {int(d[0])}"


def vllm_convert(ns, blocks13, scales13, bias13, blocks2, scales2, bias2):
    """vLLM's create_weights + gpt-oss loader copy (TP 1) + TRITON post-processing, on the GPU."""
    B = ns["Mxfp4MoeBackend"].TRITON
    E, two_i, H = blocks13.shape[0], blocks13.shape[1], blocks13.shape[2] * 32
    I = two_i // 2
    Hp, Ip = ns["mxfp4_round_up_hidden_size_and_intermediate_size"](B, H, I)
    dev = DEV
    w13 = torch.zeros(E, 2 * Ip, Hp // 2, dtype=torch.uint8, device=dev)
    s13 = torch.zeros(E, 2 * Ip, Hp // 32, dtype=torch.uint8, device=dev)
    b13 = torch.zeros(E, 2 * Ip, dtype=torch.bfloat16, device=dev)
    w2 = torch.zeros(E, Hp, Ip // 2, dtype=torch.uint8, device=dev)
    s2 = torch.zeros(E, Hp, Ip // 32, dtype=torch.uint8, device=dev)
    b2 = torch.zeros(E, Hp, dtype=torch.bfloat16, device=dev)
    w13[:, :2 * I, :H // 2] = blocks13.reshape(E, 2 * I, H // 2)
    s13[:, :2 * I, :H // 32] = scales13
    b13[:, :2 * I] = bias13
    w2[:, :H, :I // 2] = blocks2.reshape(E, H, I // 2)
    s2[:, :H, :I // 32] = scales2
    b2[:, :H] = bias2
    loaded = (w13.clone(), s13.clone(), b13.clone(), w2.clone(), s2.clone(), b2.clone())
    layer = torch.nn.Module()
    for n, t in (("w13_weight", w13), ("w2_weight", w2), ("w13_weight_scale", s13),
                 ("w2_weight_scale", s2)):
        layer.register_parameter(n, torch.nn.Parameter(t, requires_grad=False))
    out = ns["convert_gpt_oss_weight_to_mxfp4_moe_kernel_format"](
        mxfp4_backend=B, layer=layer, w13_weight=w13, w2_weight=w2, w13_weight_scale=s13,
        w2_weight_scale=s2, w13_bias=b13, w2_bias=b2)
    return out, loaded, (Hp, Ip)


def dequant(codes_u8, scales):
    """[E, N, K/2] bytes, [E, N, K/32] E8M0 -> float32 [E, N, K]."""
    lo, hi = codes_u8 & 15, codes_u8 >> 4
    c = torch.stack([lo, hi], dim=-1).flatten(-2).long()
    v = LUT.to(codes_u8.device)[c]
    s = torch.pow(2.0, scales.float() - 127.0).repeat_interleave(32, dim=-1)
    return v * s


def kernel_error(ns, w_t, pc, bias, x, w_ref, b_ref):
    from triton_kernels.matmul_ogs import matmul_ogs
    y = matmul_ogs(x, w_t, bias, precision_config=pc).float()
    ref = torch.einsum("emk,enk->emn", x.float(), w_ref) + b_ref[:, None, :]
    return float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def tensor_desc(t):
    """What the kernel reads of a triton_kernels Tensor besides its bytes."""
    st = t.storage
    fields = {k: list(v) if isinstance(v, (list, tuple, torch.Size)) else v
              for k, v in vars(st.layout).items()}
    return {"type": type(t).__name__, "dtype": str(t.dtype), "shape": [int(x) for x in t.shape],
            "shape_max": list(t.shape_max), "layout": type(st.layout).__name__,
            "layout_fields": fields, "storage_shape": list(st.data.shape),
            "storage_stride": list(st.data.stride()), "storage_dtype": str(st.data.dtype)}


def precision_desc(pc):
    return {k: repr(v) for k, v in vars(pc).items() if k != "weight_scale"}


def check_plugin_objects(ours, vllm_objs, H, Ip, rec):
    """The plugin's wrapping of moepack's bytes against vLLM's own conversion's objects."""
    from moepack_vllm.triton_mxfp4 import wrap_triton_mxfp4

    w = wrap_triton_mxfp4(ours["w13_weight"], ours["w2_weight"], ours["w13_weight_scale"],
                          ours["w2_weight_scale"], hidden=H, inter_padded=Ip)
    w13_t, w2_t, pc13, pc2 = vllm_objs
    diffs = {}
    for name, a, b in (("w13", w.w13, w13_t), ("w2", w.w2, w2_t),
                       ("w13_scale", w.w13_precision.weight_scale, pc13.weight_scale),
                       ("w2_scale", w.w2_precision.weight_scale, pc2.weight_scale)):
        da, db = tensor_desc(a), tensor_desc(b)
        if da != db:
            diffs[name] = {"plugin": da, "vllm": db}
        elif not torch.equal(a.storage.data, b.storage.data):
            diffs[name] = "storage bytes differ"
    for name, a, b in (("w13_precision", w.w13_precision, pc13),
                       ("w2_precision", w.w2_precision, pc2)):
        if precision_desc(a) != precision_desc(b):
            diffs[name] = {"plugin": precision_desc(a), "vllm": precision_desc(b)}
    rec["plugin_objects"] = diffs or "equal"
    rec["plugin_objects_equal"] = not diffs
    return w


def moe_reference(x, logits, W13, b13, W2, b2, topk, swap=False):
    """gpt-oss' MoE in fp32 (docs/gpt-oss.md): top-k of the logits, softmax over the k, per expert
    h = x W13^T + b13 on the interleaved rows (even gate, odd up), swigluoai with alpha 1.702 and
    limit 7 (gate clamped above, up both sides, up + 1), then a W2^T + b2."""
    top = logits.float().topk(topk, dim=-1)
    wts = torch.softmax(top.values, dim=-1)
    out = torch.zeros(x.shape[0], W2.shape[1], device=x.device)
    xf = x.float()
    for j in range(topk):
        e = top.indices[:, j]
        h = torch.einsum("mk,mnk->mn", xf, W13[e]) + b13[e]
        gate, up = (h[:, 1::2], h[:, 0::2]) if swap else (h[:, 0::2], h[:, 1::2])
        gate, up = gate.clamp(max=7.0), up.clamp(-7.0, 7.0)
        a = (up + 1) * gate * torch.sigmoid(1.702 * gate)
        out += wts[:, j:j + 1] * (torch.einsum("mk,mnk->mn", a, W2[e]) + b2[e])
    return out


def check_plugin_moe(fwd, w, ours, loaded, topk, seed, rec):
    """matmul_ogs per projection and vLLM's triton_kernel_moe_forward through the plugin's
    objects, against fp32; the mutants (biases dropped, gate/up exchanged) must fail."""
    from types import SimpleNamespace

    w13l, s13l, b13l, w2l, s2l, b2l = loaded
    E, H = w13l.shape[0], w2l.shape[1]
    W13, W2 = dequant(w13l, s13l), dequant(w2l, s2l)
    f13, f2 = ours["w13_bias"].float(), ours["w2_bias"].float()
    torch.manual_seed(seed)
    M = 33
    x13 = torch.randn(E, M, H, device=DEV).to(torch.bfloat16)
    x2 = torch.randn(E, M, W2.shape[2], device=DEV).to(torch.bfloat16)
    rec["plugin_w13_norm_err"] = kernel_error(None, w.w13, w.w13_precision, f13, x13, W13,
                                              b13l.float())
    rec["plugin_w2_norm_err"] = kernel_error(None, w.w2, w.w2_precision, f2, x2, W2, b2l.float())
    x = torch.randn(M, H, device=DEV).to(torch.bfloat16)
    # Distinct logits per token (no tie at the k-th place for either top-k to break its own way).
    logits = torch.stack([torch.randperm(E, device=DEV).float() * 0.75 for _ in range(M)])
    logits = (logits + 0.1 * torch.rand(M, E, device=DEV)).to(torch.bfloat16)

    def run(biases):
        qc = SimpleNamespace(w1_bias=f13 if biases else None, w2_bias=f2 if biases else None,
                             w1_precision=w.w13_precision, w2_precision=w.w2_precision)
        return fwd["triton_kernel_moe_forward"](
            hidden_states=x, w1=w.w13, w2=w.w2, gating_output=logits, topk=topk,
            renormalize=True, quant_config=qc).float()

    ref = moe_reference(x, logits, W13, b13l.float(), W2, b2l.float(), topk)
    err = lambda y, r: float((y - r).norm() / r.norm())  # noqa: E731
    y = run(True)
    rec["plugin_moe_norm_err"] = err(y, ref)
    rec["plugin_moe_mutant_no_biases_err"] = err(run(False), ref)
    rec["plugin_moe_mutant_gate_up_swapped_err"] = err(
        y, moe_reference(x, logits, W13, b13l.float(), W2, b2l.float(), topk, swap=True))
    tol = 2e-2
    rec["plugin_kernel_ok"] = max(rec["plugin_w13_norm_err"], rec["plugin_w2_norm_err"],
                                  rec["plugin_moe_norm_err"]) < tol
    rec["plugin_mutants_fail"] = min(rec["plugin_moe_mutant_no_biases_err"],
                                     rec["plugin_moe_mutant_gate_up_swapped_err"]) > tol


def check_layer(ns, src, out, layer, seed, rec):
    p = f"model.layers.{layer}.mlp.experts."
    q = p + "routed_experts."
    g = lambda f, n: f.get_tensor(n).to(DEV)  # noqa: E731
    blocks13, scales13, bias13 = (g(src, p + "gate_up_proj_" + s) for s in ("blocks", "scales", "bias"))
    blocks2, scales2, bias2 = (g(src, p + "down_proj_" + s) for s in ("blocks", "scales", "bias"))
    (w13_t, w2_t, pc13, pc2, vb13, vb2), loaded, (Hp, Ip) = vllm_convert(
        ns, blocks13, scales13, bias13, blocks2, scales2, bias2)
    wscale = lambda pc: pc.weight_scale  # noqa: E731  (triton_kernels 3.5.1 API)
    ours = {n: g(out, q + n) for n in ("w13_weight", "w2_weight", "w13_weight_scale",
                                       "w2_weight_scale", "w13_bias", "w2_bias")}
    vllm = {"w13_weight": storage_buf(w13_t), "w2_weight": storage_buf(w2_t),
            "w13_weight_scale": storage_buf(wscale(pc13)),
            "w2_weight_scale": storage_buf(wscale(pc2)), "w13_bias": vb13, "w2_bias": vb2}
    diffs = {n: first_diff(ours[n], vllm[n]) for n in ours}
    rec["bytes"] = diffs
    rec["bytes_equal"] = all(v is None for v in diffs.values())
    E_, H_ = blocks13.shape[0], blocks2.shape[1]
    plugin = check_plugin_objects(ours, (w13_t, w2_t, pc13, pc2), H_, Ip, rec)
    # The kernel on moepack's bytes, placed in vLLM's triton Tensors (same layouts and shapes).
    for n, t in (("w13_weight", w13_t), ("w2_weight", w2_t),
                 ("w13_weight_scale", wscale(pc13)), ("w2_weight_scale", wscale(pc2))):
        storage_buf(t).copy_(ours[n].view(storage_buf(t).shape))
    if DEV == "cpu":
        return
    w13l, s13l, b13l, w2l, s2l, b2l = loaded
    E = w13l.shape[0]
    torch.manual_seed(seed)
    M = 33
    x13 = torch.randn(E, M, Hp, device=DEV).to(torch.bfloat16)
    x2 = torch.randn(E, M, Ip, device=DEV).to(torch.bfloat16)
    W13, W2 = dequant(w13l, s13l), dequant(w2l, s2l)
    f13, f2 = ours["w13_bias"].float(), ours["w2_bias"].float()
    rec["w13_norm_err"] = kernel_error(ns, w13_t, pc13, f13, x13, W13, b13l.float())
    rec["w2_norm_err"] = kernel_error(ns, w2_t, pc2, f2, x2, W2, b2l.float())
    # Mutants: the reference with gate and up exchanged; the value bytes left unswizzled.
    W13s = W13.view(E, Ip, 2, Hp).flip(2).reshape(E, 2 * Ip, Hp)
    b13s = b13l.float().view(E, Ip, 2).flip(2).reshape(E, 2 * Ip)
    rec["mutant_gate_up_swapped_err"] = kernel_error(ns, w13_t, pc13, f13, x13, W13s, b13s)
    plain = w13l.reshape(-1)[: storage_buf(w13_t).numel()]
    buf = storage_buf(w13_t)
    flat = torch.zeros(buf.numel(), dtype=torch.uint8, device=DEV)
    flat[: plain.numel()] = plain
    buf.copy_(flat.view(buf.shape))
    rec["mutant_unswizzled_values_err"] = kernel_error(ns, w13_t, pc13, f13, x13, W13, b13l.float())
    check_plugin_moe(ns["forward"], plugin, ours, loaded, ns["topk"], seed + 7, rec)
    tol = 2e-2
    rec["kernel_ok"] = rec["w13_norm_err"] < tol and rec["w2_norm_err"] < tol
    rec["mutants_fail"] = (rec["mutant_gate_up_swapped_err"] > tol and
                           rec["mutant_unswizzled_values_err"] > tol)


def check_fixture(ns, path, rec):
    p = "model.layers.0.mlp.experts."
    f = SafeTensors(path)
    t = {k: f.get_tensor(k).to(DEV) for k in f.keys()}
    (w13_t, w2_t, pc13, pc2, vb13, vb2), _, _ = vllm_convert(
        ns, *(t[p + "gate_up_proj_" + s] for s in ("blocks", "scales", "bias")),
        *(t[p + "down_proj_" + s] for s in ("blocks", "scales", "bias")))
    q = p + "routed_experts."
    got = {"w13_weight": storage_buf(w13_t), "w2_weight": storage_buf(w2_t),
           "w13_weight_scale": storage_buf(pc13.weight_scale),
           "w2_weight_scale": storage_buf(pc2.weight_scale), "w13_bias": vb13, "w2_bias": vb2}
    rec["bytes"] = {n: first_diff(got[n], t[q + n]) for n in got}
    rec["bytes_equal"] = all(v is None for v in rec["bytes"].values())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--carry", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--cpu-selftest", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, a.carry)
    # The plugin's triton_mxfp4 module imports torch and triton_kernels only (no vLLM here).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                    "integrations", "vllm"))
    if a.cpu_selftest:
        global DEV
        DEV = "cpu"
        import triton_kernels.target_info as ti
        import triton_kernels.tensor_details.layout as layout
        ti.cuda_capability_geq = layout.cuda_capability_geq = lambda M, m=0: (9, 0) >= (M, m)
        layout.is_hip_cdna4 = lambda: False
        torch.cuda.get_device_name = lambda: "cpu selftest"
        torch.cuda.get_device_capability = lambda: (9, 0)
    result = {"device": torch.cuda.get_device_name(), "capability": torch.cuda.get_device_capability(),
              "torch": torch.__version__}
    import triton
    result["triton"] = triton.__version__
    # The carried vLLM sources are the ones the fixtures record.
    rec = json.load(open(sorted(glob.glob(os.path.join(a.fixtures, "*.json")))[0]))["versions"]["sha256"]
    result["sources_match_fixtures"] = {
        "oracle_mxfp4.py": sha256(os.path.join(a.carry, "vllm_src", "oracle_mxfp4.py")) ==
        rec["model_executor/layers/fused_moe/oracle/mxfp4.py"],
        "mxfp4_utils.py": sha256(os.path.join(a.carry, "vllm_src", "mxfp4_utils.py")) ==
        rec["model_executor/layers/quantization/utils/mxfp4_utils.py"]}
    ns = load_vllm(a.carry)
    ns["forward"] = load_vllm_forward(a.carry)
    result["fixtures"], result["cases"] = {}, {}
    for path in sorted(glob.glob(os.path.join(a.fixtures, "*.safetensors"))):
        name = os.path.basename(path)[:-len(".safetensors")]
        r = result["fixtures"][name] = {}
        try:
            check_fixture(ns, path, r)
        except Exception:
            r["error"] = traceback.format_exc()
        print("fixture", name, r.get("bytes_equal"), r.get("error", "")[-300:], flush=True)
    for d in sorted(glob.glob(os.path.join(a.carry, "cases", "*"))):
        name = os.path.basename(d)
        out_files = glob.glob(os.path.join(d, "out", "*.safetensors"))
        assert len(out_files) == 1, out_files
        src, out = SafeTensors(os.path.join(d, "src", "model.safetensors")), SafeTensors(out_files[0])
        layers = sorted({int(k.split(".")[2]) for k in out.keys() if "routed_experts" in k})
        ns["topk"] = json.load(open(os.path.join(d, "src", "config.json")))["num_experts_per_tok"]
        for L in layers:
            r = result["cases"][f"{name}/layer{L}"] = {}
            try:
                check_layer(ns, src, out, L, 1000 + L, r)
            except Exception:
                r["error"] = traceback.format_exc()
            print("case", name, L, json.dumps(r)[:600], flush=True)
    ok = all(r.get("bytes_equal") for r in result["fixtures"].values()) and all(
        r.get("bytes_equal") and r.get("plugin_objects_equal") and
        (DEV == "cpu" or (r.get("kernel_ok") and r.get("mutants_fail") and
                          r.get("plugin_kernel_ok") and r.get("plugin_mutants_fail")))
        for r in result["cases"].values()) and all(result["sources_match_fixtures"].values())
    result["ok"] = bool(ok and result["fixtures"] and result["cases"])
    json.dump(result, open(a.out, "w"), indent=1, default=str)
    print("OK" if result["ok"] else "FAILED")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

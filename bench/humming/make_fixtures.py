#!/usr/bin/env python3
"""Ground truth for moepack's Humming target (issue 23): what vLLM 0.33.0's Humming
post-processing (humming-kernels 0.1.19) leaves on a FusedMoE layer, for random quantized MoE
layers of chosen shapes, saved as fixtures.

For every case it builds the layer parameters exactly as vLLM's WNA16 MoE method holds them at
process_weights_after_loading (checkpoint-format tensors, gate|up stacked into w13), runs the
Humming post-processing, and writes
    <out>/<case>.safetensors   in.<param>  (inputs, vLLM's layer-parameter names)
                               out.<param> (the layer's parameters afterwards)
    <out>/<case>.json          case, shapes/dtypes, LayerConfig JSON per sublayer, schemas,
                               versions, sha256 of every tensor, ops/glue modes, error if any
and <out>/index.json.

Two independent switches:
  --ops cuda       humming's own CUDA kernels (JIT, NVRTC) -- needs a GPU; this is ground truth
  --ops emulate    humming_emu.py's CPU emulation of its three weight kernels (pack, unpack,
                   repack) and a fake sm90 DeviceInfo -- runs anywhere
  --glue vllm      vLLM 0.33.0's own code: oracle/int_wna16.convert_to_wna16_moe_kernel_format
                   (HUMMING branch) on a stand-in layer -> convert_to_humming_moe_kernel_format
                   -> humming. Needs vLLM importable (not on the device image).
  --glue mirror    the same calls into humming made directly, with vLLM's arguments (see
                   mirror_sublayer; each step cites the vLLM function it stands for). Needs only
                   humming + torch.
  --glue both      run both, require byte-identical results, save the vllm-glue result.

Typical runs:
  CPU (vLLM venv):  python make_fixtures.py --ops emulate --glue both --out fixtures
  H100 (device):    python3 make_fixtures.py --ops cuda --glue mirror --out $OUT/fx \
                        --compare fixtures          # emulation == real kernels, byte for byte
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import platform
import sys
import traceback
import zlib
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")  # no background builds at import

import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

VLLM_VERSION = "0.33.0"
HUMMING_VERSION = "0.1.19"

# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Case:
    name: str
    fmt: str  # gptq | awq | ct | moe_wna16
    bits: int
    group: int  # -1 = channelwise
    E: int
    H: int
    I: int  # noqa: E741
    sym: bool = True
    dtype: str = "bf16"
    nozero: tuple = ()  # sublayers whose codes avoid 0 (-> float{b}e0m{b-1} recode)
    bias: bool = False
    act: str | None = None  # None: 16-bit activations (stock default); else a_dtype for the
    #                         VLLM_HUMMING_INPUT_QUANT_CONFIG env (non-default path)
    note: str = ""


CASES = [
    Case("gptq_w4_g128_e4", "gptq", 4, 128, 4, 256, 128,
         note="bf16 x uint4b8 g128, no padding; weights byte-identical to Marlin (scales are "
              "not: vLLM's Marlin path permutes them 'single' when I <= group)"),
    Case("gptq_w4_g128_i384", "gptq", 4, 128, 2, 256, 384,
         note="I > group and no padding on either side: weights AND scales byte-identical "
              "to vLLM's Marlin layout"),
    Case("gptq_w4_g64_pad", "gptq", 4, 64, 2, 384, 192,
         note="w13 N 384->512, w2 N 384->512, w2 K 192->256 (Marlin pads nothing here)"),
    Case("gptq_w4_g32_e1", "gptq", 4, 32, 1, 128, 96,
         note="E=1; w13 N 192->256, w2 K 96->128 (Marlin pads I 96->128 per half instead)"),
    Case("gptq_w4_g128_nozero_w13", "gptq", 4, 128, 2, 256, 256, nozero=("w13",),
         note="w13 has no code 0 -> float4e0m3 recode; w2 keeps uint4"),
    Case("gptq_w4_g128_fp16", "gptq", 4, 128, 2, 256, 128, dtype="fp16"),
    Case("gptq_w4_channel", "gptq", 4, -1, 2, 256, 128,
         note="desc_act-free channelwise GPTQ: reaches Humming on sm90"),
    Case("gptq_w8_g128", "gptq", 8, 128, 2, 256, 128,
         note="bf16 x uint8b128: int2fp code preprocessing (bytes differ from Marlin)"),
    Case("gptq_w8_g64_fp16", "gptq", 8, 64, 2, 256, 128, dtype="fp16",
         note="fp16 x uint8b128: no preprocessing"),
    Case("gptq_w8_g128_nozero", "gptq", 8, 128, 2, 256, 128, nozero=("w13", "w2"),
         note="no code 0 anywhere -> float8e0m7 recode of both sublayers"),
    Case("awq_w4_g128", "awq", 4, 128, 2, 256, 128, sym=False),
    Case("awq_w4_g64_pad", "awq", 4, 64, 2, 384, 192, sym=False),
    Case("awq_w4_g32_nozero", "awq", 4, 32, 2, 256, 128, sym=False, nozero=("w13", "w2"),
         note="zero points present: no recode even without code 0"),
    Case("ct_w4_g128_sym", "ct", 4, 128, 3, 256, 128),
    Case("ct_w4_g32_asym_pad", "ct", 4, 32, 2, 256, 96, sym=False),
    Case("ct_w4_g32_h320", "ct", 4, 32, 2, 320, 96,
         note="H not a multiple of 128 (legal for compressed-tensors): w13 K 320->384, "
              "w2 N 320->512"),
    Case("ct_w4_g128_bias", "ct", 4, 128, 2, 256, 128, bias=True),
    Case("ct_w8_g128_sym", "ct", 8, 128, 2, 256, 128),
    Case("ct_w8_g64_asym", "ct", 8, 64, 2, 256, 128, sym=False,
         note="bf16 x uint8 + zero point: the zero point is folded into the repacked codes"),
    Case("ct_w4_channel", "ct", 4, -1, 2, 256, 128,
         note="stock vLLM 0.33 asserts strategy=='group' before this on sm90 "
              "(CompressedTensorsWNA16MoEMethod.__init__); transform shown for completeness"),
    Case("moe_wna16_w4_g64", "moe_wna16", 4, 64, 2, 256, 192,
         note="GPTQ g128 with I % 128 != 0 falls back to MoeWNA16 (group halved to 64): "
              "inputs are MoeWNA16's layer params (uint8, N-first); no recode on this path"),
    Case("gptq_w4_g128_fp8act", "gptq", 4, 128, 2, 256, 128, act="float8e4m3",
         note="NON-DEFAULT: VLLM_HUMMING_INPUT_QUANT_CONFIG a_dtype float8e4m3 -> packed-K"),
    Case("gptq_w4_g128_int8act", "gptq", 4, 128, 2, 256, 128, act="int8",
         note="NON-DEFAULT: VLLM_HUMMING_INPUT_QUANT_CONFIG a_dtype int8 -> flat weight"),
]

TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}

# ----------------------------------------------------------------------------------------------
# Inputs: the layer parameters as vLLM holds them before process_weights_after_loading's
# conversion (names from the MoE methods' create_weights).
# ----------------------------------------------------------------------------------------------


def _rng(case: Case) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(case.name.encode()))


def _codes(g, shape, bits, nozero):
    lo = 1 if nozero else 0
    return torch.randint(lo, 1 << bits, shape, generator=g, dtype=torch.int64)


def _pack_last(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack along the last dim, value i of each 32/bits at bit i*bits (GPTQ/CT order)."""
    pf = 32 // bits
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // pf, pf)
    w = (c << (torch.arange(pf) * bits)).sum(-1) & 0xFFFFFFFF
    return torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32)


def _pack_dim(codes, bits, dim):
    return _pack_last(codes.transpose(dim, -1), bits).transpose(dim, -1).contiguous()


AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]


def _pack_awq(codes):
    """AWQ int4: along the last dim, word c field s holds column 8c + AWQ_ORDER[s]."""
    c = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 8, 8)[..., AWQ_ORDER]
    return _pack_last(c.reshape(codes.shape), 4)


def _scales(g, shape, dtype):
    return (torch.rand(shape, generator=g) * 0.02 + 0.002).to(dtype)


def make_inputs(case: Case) -> dict[str, torch.Tensor]:
    g = _rng(case)
    E, H, I, b = case.E, case.H, case.I, case.bits
    dt = TORCH_DTYPE[case.dtype]
    N13, K13, N2, K2 = 2 * I, H, H, I
    G13 = 1 if case.group == -1 else K13 // case.group
    G2 = 1 if case.group == -1 else K2 // case.group
    c13 = _codes(g, (E, N13, K13), b, "w13" in case.nozero)  # [E, N, K] codes
    c2 = _codes(g, (E, N2, K2), b, "w2" in case.nozero)
    p: dict[str, torch.Tensor] = {}
    if case.fmt == "gptq":  # AutoGPTQMoEMethod.create_weights: K-first, packed along K
        p["w13_qweight"] = _pack_dim(c13.transpose(1, 2), b, 1)  # [E, K/pf, N]
        p["w2_qweight"] = _pack_dim(c2.transpose(1, 2), b, 1)
        p["w13_scales"] = _scales(g, (E, G13, N13), dt)
        p["w2_scales"] = _scales(g, (E, G2, N2), dt)
        mid = 1 << (b - 1)  # GPTQ-v1 sym zeros store mid-1; read by nobody on this path
        p["w13_qzeros"] = _pack_last(torch.full((E, G13, N13), mid - 1), b)
        p["w2_qzeros"] = _pack_last(torch.full((E, G2, N2), mid - 1), b)
    elif case.fmt == "awq":  # AutoAWQMoEMethod.create_weights: K-first, packed along N
        p["w13_qweight"] = _pack_awq(c13.transpose(1, 2).contiguous())  # [E, K, N/8]
        p["w2_qweight"] = _pack_awq(c2.transpose(1, 2).contiguous())
        p["w13_scales"] = _scales(g, (E, G13, N13), dt)
        p["w2_scales"] = _scales(g, (E, G2, N2), dt)
        p["w13_qzeros"] = _pack_awq(_codes(g, (E, G13, N13), b, False))
        p["w2_qzeros"] = _pack_awq(_codes(g, (E, G2, N2), b, False))
    elif case.fmt == "ct":  # CompressedTensorsWNA16MoEMethod.create_weights: N-first
        p["w13_weight_packed"] = _pack_last(c13, b)  # [E, N, K/pf]
        p["w2_weight_packed"] = _pack_last(c2, b)
        p["w13_weight_scale"] = _scales(g, (E, N13, G13), dt)
        p["w2_weight_scale"] = _scales(g, (E, N2, G2), dt)
        if not case.sym:  # packed along N: [E, N/pf, G]
            p["w13_weight_zero_point"] = _pack_dim(_codes(g, (E, N13, G13), b, False), b, 1)
            p["w2_weight_zero_point"] = _pack_dim(_codes(g, (E, N2, G2), b, False), b, 1)
        p["w13_weight_shape"] = torch.tensor([[N13, K13]] * E, dtype=torch.float32)
        p["w2_weight_shape"] = torch.tensor([[N2, K2]] * E, dtype=torch.float32)
    elif case.fmt == "moe_wna16":  # MoeWNA16Method.create_weights: N-first uint8
        assert b == 4 and case.sym
        pk = lambda c: _pack_last(c, 4).view(torch.uint8).reshape(c.shape[0], c.shape[1], -1)  # noqa
        p["w13_qweight"] = pk(c13)  # [E, N, K/2] uint8, low nibble = even k
        p["w2_qweight"] = pk(c2)
        p["w13_scales"] = _scales(g, (E, N13, G13), dt)
        p["w2_scales"] = _scales(g, (E, N2, G2), dt)
        p["w13_qzeros"] = torch.empty((0,), dtype=torch.int32)  # gptq + sym: placeholders
        p["w2_qzeros"] = torch.empty((0,), dtype=torch.int32)
    else:
        raise ValueError(case.fmt)
    if case.bias:
        p["w13_bias"] = (torch.randn((E, N13), generator=g) * 0.1).to(dt)
        p["w2_bias"] = (torch.randn((E, N2), generator=g) * 0.1).to(dt)
    return p


# ----------------------------------------------------------------------------------------------
# Checkpoint schema dicts: vLLM's oracle/int_wna16._humming_wna16_weight_schema output
# ----------------------------------------------------------------------------------------------


def weight_schema_config(case: Case) -> dict:
    if case.fmt == "gptq":
        return {"quant_method": "gptq", "bits": case.bits, "group_size": case.group,
                "desc_act": False, "sym": case.sym}
    if case.fmt == "awq":
        return {"quant_method": "awq", "bits": case.bits, "group_size": case.group,
                "zero_point": not case.sym}
    if case.fmt == "ct":
        return {"quant_method": "compressed-tensors", "format": "pack-quantized", "type": "int",
                "num_bits": case.bits, "strategy": "channel" if case.group == -1 else "group",
                "group_size": None if case.group == -1 else case.group,
                "symmetric": case.sym}
    raise ValueError(case.fmt)


def input_quant_config(case: Case) -> dict | None:
    return None if case.act is None else {"quant_method": "humming", "a_dtype": case.act}


# ----------------------------------------------------------------------------------------------
# Glue 1: vLLM's own code
# ----------------------------------------------------------------------------------------------


def run_vllm_glue(case: Case, inputs: dict, device: str):
    import vllm.platforms as vp
    from vllm.model_executor.layers.fused_moe.activation import MoEActivation
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.platforms.interface import DeviceCapability

    if device == "cpu":  # check_and_fallback_input_schema asks the platform for the SM
        vp.current_platform.get_device_capability = lambda *a, **k: DeviceCapability(9, 0)

    qc = vllm_quant_config(case)
    layer = torch.nn.Module()
    for k, v in inputs.items():
        layer.register_parameter(k, torch.nn.Parameter(v.clone().to(device), requires_grad=False))
    layer.moe_config = SimpleNamespace(
        has_bias=case.bias, num_local_experts=case.E, activation=MoEActivation.SILU,
        intermediate_size_per_partition=case.I, hidden_dim=case.H)
    layer.params_dtype = TORCH_DTYPE[case.dtype]
    layer.layer_name = "model.layers.0.mlp.experts"
    if case.fmt == "moe_wna16":
        layer.group_size = case.group
    iqc = input_quant_config(case)
    old = os.environ.pop("VLLM_HUMMING_INPUT_QUANT_CONFIG", None)
    if iqc is not None:
        os.environ["VLLM_HUMMING_INPUT_QUANT_CONFIG"] = json.dumps(iqc)
    try:
        d = next(iter(inputs.values()))
        ret = int_wna16.convert_to_wna16_moe_kernel_format(
            int_wna16.WNA16MoEBackend.HUMMING, layer, qc, None, d, d, d, d)
    finally:
        os.environ.pop("VLLM_HUMMING_INPUT_QUANT_CONFIG", None)
        if old is not None:
            os.environ["VLLM_HUMMING_INPUT_QUANT_CONFIG"] = old
    assert ret is None  # HUMMING rewrites the layer in place
    out = {k: v.detach() for k, v in layer.state_dict().items()}
    info = {s: {"layer_config": layer.humming_configs[s].to_str(),
                "weight_schema": repr(layer.weight_schemas[s]),
                "input_schema": repr(layer.input_schemas[s]),
                "derived": derived(layer.humming_configs[s])}
            for s in ("w13", "w2")}
    return out, info


def vllm_quant_config(case: Case):
    if case.fmt == "gptq":
        from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
        return AutoGPTQConfig(weight_bits=case.bits, group_size=case.group, desc_act=False,
                              is_sym=case.sym, lm_head_quantized=False, dynamic={},
                              full_config={})
    if case.fmt == "awq":
        from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig
        return AutoAWQConfig(weight_bits=case.bits, group_size=case.group,
                             zero_point=not case.sym, lm_head_quantized=False,
                             modules_to_not_convert=None, full_config={})
    if case.fmt == "ct":
        from compressed_tensors.quantization import QuantizationArgs
        if case.group == -1:
            return QuantizationArgs(num_bits=case.bits, type="int", symmetric=case.sym,
                                    strategy="channel")
        return QuantizationArgs(num_bits=case.bits, type="int", symmetric=case.sym,
                                group_size=case.group, strategy="group")
    if case.fmt == "moe_wna16":
        from vllm.model_executor.layers.quantization.moe_wna16 import MoeWNA16Config
        return MoeWNA16Config(linear_quant_method="gptq", weight_bits=case.bits,
                              group_size=128, has_zp=not case.sym, lm_head_quantized=False,
                              modules_to_not_convert=None,
                              full_config={"desc_act": False, "sym": case.sym})
    raise ValueError(case.fmt)


# ----------------------------------------------------------------------------------------------
# Glue 2: the same humming calls, made directly (what runs on the device image, no vLLM there)
# ----------------------------------------------------------------------------------------------


def mirror_sublayer(case: Case, tensors: dict, sub: str, device):
    """vllm/model_executor/layers/quantization/utils/humming/moe.py _process_single_sublayer,
    step by step, for force_weight_schema=None."""
    from humming import dtypes
    from humming.schema import BaseWeightSchema, HummingInputSchema, HummingWeightSchema
    from humming.transform import prepare_and_transform_humming_tensors

    dt = TORCH_DTYPE[case.dtype]
    E, H, I = case.E, case.H, case.I
    # convert_to_humming_moe_kernel_format: sublayer_configs from moe_config (gated: 2I)
    shape_n, shape_k = (2 * I, H) if sub == "w13" else (H, I)
    # _convert_sublayer_to_humming: gate|up are two N stacks
    n_stacks = [shape_n // 2] * 2 if sub == "w13" else [shape_n]
    k_stacks = [shape_k]
    # input schema: VLLM_HUMMING_INPUT_QUANT_CONFIG unset -> humming_is_layer_skipped({}) ->
    # HummingInputSchema(); set -> HummingInputSchema.from_config(cfg), allow_fallback False
    iqc = input_quant_config(case)
    in_schema = HummingInputSchema() if iqc is None else HummingInputSchema.from_config(iqc)
    if case.fmt == "moe_wna16":  # oracle/int_wna16._MoeWNA16HummingWeightSchema.convert_humming
        out = {"weight": tensors["qweight"].contiguous().view(torch.int32),
               "weight_scale": tensors["scales"].to(dt)}
        assert case.sym
        ws = HummingWeightSchema(b_dtype=dtypes.DataType.from_str(f"uint{case.bits}"),
                                 weight_scale_group_size=case.group, has_zero_point=False)
    else:  # BaseWeightSchema.from_config(_humming_wna16_weight_schema(quant_config))
        schema = BaseWeightSchema.from_config(weight_schema_config(case))
        ws, out = schema.convert_humming(tensors=tensors, shape_n_stacks=n_stacks,
                                         shape_k_stacks=k_stacks, param_dtype=dt,
                                         num_experts=E)
    in_schema, in_tensors = in_schema.convert_humming(
        tensors=tensors, shape_n_stacks=n_stacks, shape_k_stacks=k_stacks, param_dtype=dt,
        num_experts=E)
    out.update(in_tensors)
    # humming_schema.check_and_fallback_input_schema: compatible + (16-bit input, or explicit
    # config without allow_fallback) -> the input schema unchanged
    if not in_schema.is_compatible_with(ws, dt):
        raise ValueError(f"No compatible Humming input schema for {in_schema} with {ws}")
    # _prepare_and_transform_sublayer
    config, res = prepare_and_transform_humming_tensors(
        tensors=out, shape_n=shape_n, shape_k=shape_k, pad_n_to_multiple=256,
        pad_k_to_multiple=128, input_schema=in_schema, weight_schema=ws, has_bias=case.bias,
        num_experts=E, torch_dtype=dt, device=torch.device(device))
    info = {"layer_config": config.to_str(), "weight_schema": repr(ws),
            "input_schema": repr(in_schema), "derived": derived(config)}
    return res, info


def run_mirror_glue(case: Case, inputs: dict, device: str):
    out, info = {}, {}
    for sub in ("w13", "w2"):
        t = {k[len(sub) + 1:]: v.to(device) for k, v in inputs.items()
             if k.startswith(sub + "_")}
        res, info[sub] = mirror_sublayer(case, t, sub, device)
        out.update({f"{sub}_{k}": v for k, v in res.items()})
    return out, info


def derived(cfg) -> dict:
    """LayerConfig properties that steer the weight transform (not part of its JSON)."""
    names = ["is_umma_supported", "use_raw_weight", "use_flat_weight", "use_ldmatrix_dequant",
             "use_native_dequant", "use_block_scaled_mma", "should_apply_bs_on_c"]
    res = {}
    for n in names:
        try:
            res[n] = bool(getattr(cfg, n))
        except Exception as exc:  # noqa: BLE001
            res[n] = f"error: {exc}"
    return res


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------


def sha(t: torch.Tensor) -> str:
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()


def tensor_meta(ts: dict) -> dict:
    return {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape),
                "sha256": sha(v)} for k, v in sorted(ts.items())}


def run_case(case: Case, glue: str, device: str, given=None):
    inputs = make_inputs(case) if given is None else given
    results = {}
    for gl in (["vllm", "mirror"] if glue == "both" else [glue]):
        fn = run_vllm_glue if gl == "vllm" else run_mirror_glue
        try:
            out, info = fn(case, inputs, device)
            out = {k: v.detach().cpu().contiguous() for k, v in out.items()}
            results[gl] = (out, info, None)
        except Exception as exc:  # noqa: BLE001
            results[gl] = (None, None, f"{type(exc).__name__}: {exc}".strip()[:2000])
            if os.environ.get("FIXTURES_TRACE"):
                traceback.print_exc()
    if glue == "both":
        a, b = results["vllm"], results["mirror"]
        if (a[2] is None) != (b[2] is None):
            raise SystemExit(f"{case.name}: vllm glue error={a[2]!r}, mirror error={b[2]!r}")
        if a[2] is None:
            if sorted(a[0]) != sorted(b[0]):
                raise SystemExit(f"{case.name}: names differ {sorted(a[0])} vs {sorted(b[0])}")
            for k in a[0]:
                if a[0][k].dtype != b[0][k].dtype or not torch.equal(a[0][k], b[0][k]):
                    raise SystemExit(f"{case.name}: {k} differs between vllm and mirror glue")
            for s in ("w13", "w2"):
                if a[1][s]["layer_config"] != b[1][s]["layer_config"]:
                    raise SystemExit(f"{case.name}: {s} LayerConfig differs:\n"
                                     f"{a[1][s]['layer_config']}\n{b[1][s]['layer_config']}")
        return inputs, results["vllm"], "vllm+mirror (identical)"
    return inputs, results[glue], glue


def versions(ops: str) -> dict:
    v = {"vllm": VLLM_VERSION, "torch": torch.__version__, "python": platform.python_version(),
         "ops": "cuda" if ops == "cuda" else "cpu-emulation"}
    try:
        import humming
        v["humming-kernels"] = humming.__version__
    except Exception:  # noqa: BLE001
        v["humming-kernels"] = "?"
    if ops == "cuda":
        v["device"] = torch.cuda.get_device_name(0)
        v["sm"] = "%d%d" % torch.cuda.get_device_capability(0)
        try:
            from humming.jit.runtime import KernelRuntime
            v["humming_compiler"] = KernelRuntime._get_compiler().signature()
        except Exception as exc:  # noqa: BLE001
            v["humming_compiler"] = f"? {exc}"
    return v


def save_case(out_dir: Path, case: Case, inputs, result, glue_desc, vers):
    from safetensors.torch import save_file

    out, info, err = result
    tensors = {f"in.{k}": v.contiguous().clone() for k, v in inputs.items()}
    if out is not None:
        tensors.update({f"out.{k}": v.contiguous().clone() for k, v in out.items()})
    save_file(tensors, str(out_dir / f"{case.name}.safetensors"))
    meta = {
        "case": dataclasses.asdict(case),
        "versions": vers,
        "glue": glue_desc,
        "pad_n_to_multiple": 256, "pad_k_to_multiple": 128,
        "inputs": tensor_meta(inputs),
        "outputs": tensor_meta(out) if out is not None else None,
        "sublayers": ({s: {**info[s], "layer_config": json.loads(info[s]["layer_config"]),
                           "layer_config_str": info[s]["layer_config"]}
                       for s in ("w13", "w2")} if info else None),
        "error": err,
    }
    meta["case"]["nozero"] = list(case.nozero)
    (out_dir / f"{case.name}.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def compare(out_dir: Path, ref_dir: Path, names) -> int:
    """Byte comparison with another fixture dir: tensors when its .safetensors are there, else the
    sha256 recorded in its .json (inputs too, so the random inputs are proven the same)."""
    bad = 0
    for n in names:
        a_meta = json.loads((out_dir / f"{n}.json").read_text())
        rp = ref_dir / f"{n}.json"
        if not rp.exists():
            print(f"COMPARE {n}: no reference")
            bad += 1
            continue
        b_meta = json.loads(rp.read_text())
        if (a_meta["error"] is None) != (b_meta["error"] is None):
            print(f"COMPARE {n}: error mismatch {a_meta['error']!r} vs {b_meta['error']!r}")
            bad += 1
            continue
        if a_meta["error"] is not None:
            print(f"COMPARE {n}: both error (ok): {a_meta['error'][:100]}")
            continue
        diffs = []
        for part in ("inputs", "outputs"):
            a, b = a_meta[part], b_meta[part]
            diffs += [f"{part}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        cfg = [s for s in ("w13", "w2") if a_meta["sublayers"][s]["layer_config_str"]
               != b_meta["sublayers"][s]["layer_config_str"]]
        status = "IDENTICAL" if not diffs and not cfg else f"DIFF {diffs} configs={cfg}"
        print(f"COMPARE {n}: {status} ({b_meta['versions'].get('ops')} reference)")
        bad += bool(diffs or cfg)
    print(f"compare: {len(names) - bad} passed, {bad} failed")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ops", choices=["cuda", "emulate"], required=True)
    ap.add_argument("--glue", choices=["vllm", "mirror", "both"], default="mirror")
    ap.add_argument("--cases", default="all", help="comma-separated names, or all")
    ap.add_argument("--compare", type=Path, help="fixture dir to compare outputs with")
    ap.add_argument("--inputs", type=Path,
                    help="take the inputs from this file (written as <out>/inputs.safetensors by "
                         "an earlier run: keys '<case>/<param>') instead of generating them")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        for c in CASES:
            print(c.name, "-", c.note)
        return 0
    cases = CASES if args.cases == "all" else [c for c in CASES if c.name in args.cases.split(",")]
    device = "cuda" if args.ops == "cuda" else "cpu"
    if args.ops == "emulate":
        import humming_emu
        humming_emu.install(90)
    else:
        assert torch.cuda.is_available(), "--ops cuda needs a GPU"
    args.out.mkdir(parents=True, exist_ok=True)
    vers = versions(args.ops)
    index = []
    given_all = None
    if args.inputs:
        from safetensors.torch import load_file
        given_all = load_file(str(args.inputs))
    all_inputs = {}
    for case in cases:
        given = None
        if given_all is not None:
            given = {k.split("/", 1)[1]: v for k, v in given_all.items()
                     if k.split("/", 1)[0] == case.name}
        inputs, result, glue_desc = run_case(case, args.glue, device, given)
        all_inputs.update({f"{case.name}/{k}": v.contiguous().clone() for k, v in inputs.items()})
        meta = save_case(args.out, case, inputs, result, glue_desc, vers)
        subs = meta["sublayers"] or {}
        summary = {s: {k: subs[s]["layer_config"][k] for k in
                       ("b_dtype", "a_dtype", "shape_n", "shape_k", "pad_shape_n", "pad_shape_k",
                        "use_packed_k_layout")} for s in subs}
        index.append({"name": case.name, "error": meta["error"], "summary": summary,
                      "note": case.note})
        print(f"{case.name}: " + (f"ERROR {meta['error'][:160]}" if meta["error"] else
              "; ".join(f"{s} {v['b_dtype']} N{v['shape_n']}(+{v['pad_shape_n']}) "
                        f"K{v['shape_k']}(+{v['pad_shape_k']})" for s, v in summary.items())),
              flush=True)
    from safetensors.torch import save_file
    save_file(all_inputs, str(args.out / "inputs.safetensors"))
    (args.out / "index.json").write_text(json.dumps({"versions": vers, "cases": index},
                                                    indent=1) + "\n")
    if args.compare:
        return 1 if compare(args.out, args.compare, [c.name for c in cases]) else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

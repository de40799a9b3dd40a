#!/usr/bin/env python3
"""Regenerates tests/trtllm_fp4/fixtures/nvfp4_*.safetensors and manifest_nvfp4.json: what vLLM
0.33.0 leaves on a FusedMoE layer of an NVFP4 W4A4 checkpoint (ModelOpt NVFP4, compressed-tensors
nvfp4-pack-quantized) for the FlashInfer TRT-LLM-Gen NVFP4 experts (FLASHINFER_TRTLLM, sm100),
computed by vLLM's and FlashInfer 0.7.2.post1's own functions on the CPU, for
tests/golden/trtllm_nvfp4.cpp to compare moepack's trtllm-nvfp4 bytes with (docs/trtllm_fp4.md).

Per case (<source>_<case>.safetensors):
  in.<proj>.<tensor>   one Linear per expert and projection as the checkpoint stores it:
      ModelOpt:  in.<e>.<w1|w3|w2>.weight U8 [N, K/2], .weight_scale F8_E4M3 [N, K/16],
                 .weight_scale_2 F32 [], .input_scale F32 []
      CT:        in.<e>.<w1|w3|w2>.weight_packed, .weight_scale, .weight_global_scale F32 [1],
                 .input_global_scale F32 [1]
      random e2m1 codes, e4m3 block scales (finite, positive), global scales and activation
      scales as producers write them (gate and up sharing theirs, as both producers fuse them;
      activation scales differing per expert, so that vLLM's max over the experts matters).
  out.<name>           every parameter the layer holds after process_weights_after_loading, in
      the layer's parameter order (manifest: "params"): the method's own create_weights on a
      module, the checkpoint copied in as the FusedMoE loader does (w1 rows then w3 rows of
      w13, per expert), then the method's own process_weights_after_loading with the backend
      FLASHINFER_TRTLLM, whose convert_to_nvfp4_moe_kernel_format and the experts'
      TrtLlmNvFp4ExpertsBase.process_weights_after_loading (the g1_alphas fold and g1_scale_c)
      run unchanged. Only the modular kernel object is not built (make_nvfp4_moe_kernel /
      _build_moe_kernel construct prepare/finalize objects that need a GPU): its experts part is
      stood in for by an object of TrtLlmNvFp4ExpertsBase's attributes, built from vLLM's own
      make_nvfp4_moe_quant_config.

FlashInfer: its row indices are plain torch; its block-scale interleave runs on its host path
(fixture_common.py: the Python wrapper's device query bypassed).

Run (CPU only): ~/.cache/moepack/venv-vllm-0.33.0/bin/python tests/trtllm_fp4/generate_nvfp4.py
Nothing here runs at test time.
"""
from types import SimpleNamespace

import torch

# Before vLLM: FlashInfer's block-scale interleave on the CPU (fixture_common.py).
from fixture_common import save_fixture, write_manifest

from vllm.model_executor import parameter as vllm_parameter  # noqa: E402
from vllm.model_executor.layers.fused_moe.activation import MoEActivation  # noqa: E402
from vllm.model_executor.layers.fused_moe.experts import trtllm_nvfp4_moe as vllm_trt  # noqa: E402
from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as vllm_nvfp4  # noqa: E402
from vllm.model_executor.layers.quantization import modelopt as vllm_modelopt  # noqa: E402
from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (  # noqa: E402,E501
    compressed_tensors_moe_w4a4_nvfp4 as vllm_ct,
)

# ModelWeightParameter asks the (absent) tensor-parallel group for its rank: one rank of one.
vllm_parameter.get_tensor_model_parallel_rank = lambda: 0
vllm_parameter.get_tensor_model_parallel_world_size = lambda: 1

BACKEND = vllm_nvfp4.NvFp4MoeBackend.FLASHINFER_TRTLLM

# (name, E, H, I, gated): H padded to 256 or not, I padded to 64 (gated) / 128 or not.
CASES = [
    ("e2_h192_i96", 2, 192, 96, True),
    ("e3_h320_i160", 3, 320, 160, True),
    ("e4_h256_i128", 4, 256, 128, True),
    ("e2_h512_i64", 2, 512, 64, True),
    ("e2_h192_i96_relu2", 2, 192, 96, False),
]


class Layer(torch.nn.Module):
    """The attributes of a RoutedExperts the NVFP4 post-processing reads."""

    def __init__(self, E, H, I, gated):
        super().__init__()
        act = MoEActivation.SILU if gated else MoEActivation.RELU2_NO_MUL
        self.activation = act
        self.moe_config = SimpleNamespace(
            moe_parallel_config=SimpleNamespace(enable_eplb=False),
            hidden_dim=H,
            hidden_dim_unpadded=None,
            intermediate_size_per_partition=I,
        )

    def _expert_routing_tables(self):
        return None


def fake_experts(quant_config, gated):
    """TrtLlmNvFp4ExpertsBase's state as __init__ sets it, without a device."""
    e = SimpleNamespace(
        quant_config=quant_config,
        moe_config=SimpleNamespace(is_act_and_mul=gated),
        is_situ=False,
        _gemm1_clamp_limit_unfolded=None,
        _gemm1_beta_unfolded=None,
        gemm1_alpha=None,
    )
    e._compute_g1_scale_c = lambda: vllm_trt.TrtLlmNvFp4ExpertsBase._compute_g1_scale_c(e)
    return e


def method_self(cls, gated):
    s = SimpleNamespace(
        nvfp4_backend=BACKEND,
        moe=SimpleNamespace(is_act_and_mul=gated),
        use_a16=False,
        per_token_activation=False,
        experts_cls=vllm_trt.TrtLlmNvFp4ExpertsBase,
        use_global_sf=vllm_nvfp4.is_global_sf_supported_for_nvfp4_backend(BACKEND),
        group_size=16,
        quant_config=SimpleNamespace(group_size=16, is_checkpoint_nvfp4_serialized=True),
    )
    s.get_fused_moe_quant_config = lambda layer: cls.get_fused_moe_quant_config(s, layer)
    return s


def random_linear(gen, n, k):
    codes = torch.randint(0, 256, (n, k // 2), generator=gen, dtype=torch.uint8)
    # e4m3 block scales: positive finite bytes 0x08..0x7e (no NaN 0x7f), as a float8 view.
    scales = torch.randint(8, 0x7F, (n, k // 16), generator=gen, dtype=torch.uint8)
    return codes, scales


def draw_global(gen):
    # amax / (6 * 448) for an amax in [1.5, 3): what ModelOpt stores as weight_scale_2.
    return float(1.5 + 1.5 * torch.rand(1, generator=gen).item()) / (6.0 * 448.0)


def checkpoint(gen, E, H, I, gated):
    """Per expert: {proj: (codes, scales, weight_global, act_global)} in ModelOpt's convention
    (decode multipliers; the CT case stores their reciprocals)."""
    experts = []
    for _ in range(E):
        g13 = draw_global(gen)
        a13 = draw_global(gen) * 100.0  # activations of another range than the weights
        d = {}
        for p in ("w1", "w3") if gated else ("w1",):
            d[p] = (*random_linear(gen, I, H), g13, a13)
        d["w2"] = (*random_linear(gen, H, I), draw_global(gen), draw_global(gen) * 100.0)
        experts.append(d)
    return experts


def f32(v):
    return torch.tensor(v, dtype=torch.float32)


def fill_layer(layer, ck, I, gated, weight, weight_global, act_global, stored):
    """The checkpoint `ck` copied into `layer` as the FusedMoE loader does (w1 rows then w3 rows
    of w13, per expert), and the checkpoint's tensors (in.<e>.<proj>.<name>). The layer's
    parameters are w13_<name> / w2_<name> for the checkpoint's <name>s: `weight` (the packed
    codes), weight_scale, `weight_global` and `act_global`; `stored(v)` is how the checkpoint
    stores a global scale whose decode multiplier is v (ModelOpt: v, a scalar; CT: 1 / v, [1])."""
    tensors = {}
    with torch.no_grad():
        for e, d in enumerate(ck):
            shards = ("w1", "w3") if gated else ("w1",)
            for j, p in enumerate(shards):
                c, sc, g, a = d[p]
                getattr(layer, f"w13_{weight}")[e, j * I:(j + 1) * I] = c
                layer.w13_weight_scale.view(torch.uint8)[e, j * I:(j + 1) * I] = sc
                getattr(layer, f"w13_{weight_global}")[e, j] = stored(g).reshape(())
                getattr(layer, f"w13_{act_global}")[e, j] = stored(a).reshape(())
            c, sc, g, a = d["w2"]
            getattr(layer, f"w2_{weight}")[e] = c
            layer.w2_weight_scale.view(torch.uint8)[e] = sc
            getattr(layer, f"w2_{weight_global}")[e] = stored(g).reshape(())
            getattr(layer, f"w2_{act_global}")[e] = stored(a).reshape(())
            for p, (c, sc, g, a) in d.items():
                tensors[f"in.{e}.{p}.{weight}"] = c
                tensors[f"in.{e}.{p}.weight_scale"] = sc.view(torch.float8_e4m3fn)
                tensors[f"in.{e}.{p}.{weight_global}"] = stored(g)
                tensors[f"in.{e}.{p}.{act_global}"] = stored(a)
    return tensors


def run_modelopt(ck, E, H, I, gated):
    cls = vllm_modelopt.ModelOptNvFp4FusedMoE
    s = method_self(cls, gated)
    layer = Layer(E, H, I, gated)
    cls.create_weights(s, layer, E, H, I, torch.bfloat16, weight_loader=lambda *a: None,
                       global_num_experts=E)
    tensors = fill_layer(layer, ck, I, gated, "weight", "weight_scale_2", "input_scale", f32)

    def build(layer_):
        qc = s.get_fused_moe_quant_config(layer_)
        vllm_trt.TrtLlmNvFp4ExpertsBase.process_weights_after_loading(fake_experts(qc, gated),
                                                                     layer_)

    s._build_moe_kernel = build
    s._restore_padded_moe_dims = lambda layer_: None
    cls.process_weights_after_loading(s, layer)
    return layer, tensors


def run_ct(ck, E, H, I, gated):
    cls = vllm_ct.CompressedTensorsW4A4Nvfp4MoEMethod
    s = method_self(cls, gated)
    layer = Layer(E, H, I, gated)
    cls.create_weights(s, layer, E, H, I, torch.bfloat16)
    tensors = fill_layer(layer, ck, I, gated, "weight_packed", "weight_global_scale",
                         "input_global_scale", lambda v: (f32(1.0) / f32(v)).reshape(1))

    def make_kernel(moe_quant_config, **_):
        return SimpleNamespace(fused_experts=SimpleNamespace(
            process_weights_after_loading=lambda layer_: (
                vllm_trt.TrtLlmNvFp4ExpertsBase.process_weights_after_loading(
                    fake_experts(moe_quant_config, gated), layer_))))

    saved = vllm_ct.make_nvfp4_moe_kernel
    vllm_ct.make_nvfp4_moe_kernel = make_kernel
    try:
        cls.process_weights_after_loading(s, layer)
    finally:
        vllm_ct.make_nvfp4_moe_kernel = saved
    return layer, tensors


def one_case(source, name, E, H, I, gated, gen):
    ck = checkpoint(gen, E, H, I, gated)
    layer, tensors = (run_modelopt if source == "modelopt" else run_ct)(ck, E, H, I, gated)
    params = []
    for pname, p in layer.named_parameters():
        tensors[f"out.{pname}"] = p.data.detach().contiguous()
        params.append({"name": pname, "dtype": str(p.dtype), "shape": list(p.shape)})
    save_fixture(f"nvfp4_{source}_{name}", tensors)
    return {"source": source, "name": name, "experts": E, "hidden": H, "inter": I,
            "gated": gated, "hidden_padded": layer.moe_config.hidden_dim,
            "inter_padded": layer.moe_config.intermediate_size_per_partition,
            "backend": BACKEND.value, "params": params}


def main():
    gen = torch.Generator().manual_seed(2606)
    cases = [one_case(src, *c, gen) for src in ("modelopt", "ct") for c in CASES]
    write_manifest("manifest_nvfp4.json", "tests/trtllm_fp4/generate_nvfp4.py", "nvfp4", cases)


if __name__ == "__main__":
    main()

"""Tensor- and expert-parallel artifacts (`convert --tensor-parallel-size N`, `--expert-parallel N`)
against vLLM 0.33's own sharding, on the CPU, on random shapes.

Ground truth is vLLM's code, not moepack's: for every rank, vLLM 0.33's RoutedExperts.weight_loader
(with its _load_w13 / _load_w2 / _load_model_weight_or_group_weight_scale, which narrow the
checkpoint by tp_rank) loads the GPTQ source into parameters of the rank's shape (what
GPTQMarlinMoEMethod.create_weights makes for intermediate_size_per_partition = I / tp), with the
expert map of vLLM's determine_expert_map for expert parallelism. The rank's artifact tensors,
decoded by tests/vllm/layouts.py (the Marlin layout as the kernel reads it, independent of
moepack's C++), must equal those parameters code for code and scale for scale (fp16 -> bf16, the
serving dtype). Only the object the loader runs on is a stand-in (no process group is needed to
narrow a tensor); the loading code is vLLM's.
"""

from __future__ import annotations

import json
import random
import subprocess
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import vllm_harness  # noqa: F401  (VLLM_TARGET_DEVICE=cpu before vLLM is imported)
from conftest import MOEPACK
from layouts import marlin_codes, unpack_rows, unpermute_scales

_LOADER_METHODS = ("weight_loader", "_load_w13", "_load_w2",
                   "_load_model_weight_or_group_weight_scale", "_load_per_channel_weight_scale",
                   "_narrow_expert_data_for_padding", "_get_hidden_dim",
                   "_map_global_expert_id_to_local_expert_id")


class GPTQMarlinMoEMethod:  # the loader only reads the class name of its quant method
    pass


def vllm_rank_loader(tp: int, rank: int, ep: int, placement: str, experts: int, inter: int):
    """An object running vLLM 0.33's RoutedExperts loading methods for one rank."""
    from vllm.model_executor.layers.fused_moe.expert_map_manager import determine_expert_map
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    ns = {name: RoutedExperts.__dict__[name] for name in _LOADER_METHODS}
    loader = type("RankLoader", (), ns)()
    ep_rank = rank if ep > 1 else 0
    local, expert_map, _ = determine_expert_map(ep, ep_rank, experts, placement)
    loader.local_experts = local
    loader.expert_map_manager = types.SimpleNamespace(
        map_global_to_local=lambda g: int(expert_map[g]) if expert_map is not None else g,
        num_fused_shared_experts=0)
    loader.quant_config = None
    loader.quant_method = GPTQMarlinMoEMethod()
    loader._fused_shared_expert_quantizer = None
    loader._loaded_expert_biases = set()
    loader.moe_config = types.SimpleNamespace(
        tp_rank=rank if tp > 1 else 0, tp_size=tp, is_act_and_mul=True,
        moe_parallel_config=types.SimpleNamespace(tp_size=tp), tp_shard_with_padding=False,
        intermediate_size=inter, intermediate_size_per_partition=inter // tp,
        num_logical_experts=experts)
    return loader


def gptq_rank_params(loader, src: dict, prefix: str, experts: int, hidden: int, ipp: int,
                     group: int) -> dict[str, torch.Tensor]:
    """The rank's GPTQ parameters as vLLM 0.33 creates (GPTQ, K-first, is_transposed) and loads
    them from the source's per-expert tensors."""
    E = loader.local_experts
    shapes = {"w13_qweight": (E, hidden // 8, 2 * ipp), "w13_scales": (E, hidden // group, 2 * ipp),
              "w2_qweight": (E, ipp // 8, hidden), "w2_scales": (E, ipp // group, hidden)}
    params = {}
    for name, shape in shapes.items():
        dt = torch.int32 if "qweight" in name else torch.float16
        p = torch.nn.Parameter(torch.zeros(shape, dtype=dt), requires_grad=False)
        p.is_transposed = True
        if "scales" in name:
            p.quant_method = "group"
        params[name] = p
    for g in range(experts):
        for proj, shard in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            stem = "w2" if shard == "w2" else "w13"
            for suffix in ("qweight", "scales"):
                t = src[f"{prefix}.{g}.{proj}.{suffix}"]
                loader.weight_loader(params[f"{stem}_{suffix}"], t, f"experts.{stem}_{suffix}",
                                     shard, g)
    return {k: v.data for k, v in params.items()}


def decode_rank(t: dict, key: str, E: int, K: int, N: int):
    qw, s = t[key + "qweight"], t[key + "scales"]
    codes = torch.stack([marlin_codes(qw[e], 4, K, N) for e in range(E)])
    scales = torch.stack([unpermute_scales(s[e]) for e in range(E)])
    return codes, scales


def expect_rank_equal(art: Path, manifest: dict, rank: int, ranks: int, want: dict, E: int,
                      hidden: int, ipp: int, layer_prefix: str) -> None:
    tag = f"rank{rank:02d}-of-{ranks:02d}"
    files = manifest["parallel"]["ranks"][rank]["shards"]
    assert files == [f"model-{tag}.safetensors"]
    t = {}
    for f in files:  # the rank's own file only
        for k, v in load_file(str(art / f)).items():
            assert k.startswith(tag + "/"), k
            t[k] = v
    key = f"{tag}/{layer_prefix}"
    for stem, K, N in (("w13_", hidden, 2 * ipp), ("w2_", ipp, hidden)):
        codes, scales = decode_rank(t, key + stem, E, K, N)
        q = want[stem + "qweight"]
        want_codes = torch.stack([unpack_rows(q[e], 4) for e in range(E)])
        assert torch.equal(codes, want_codes), f"{tag} {stem}codes differ from vLLM's loader"
        want_scales = want[stem + "scales"].to(torch.bfloat16)
        assert torch.equal(scales.view(torch.int16), want_scales.view(torch.int16)), \
            f"{tag} {stem}scales differ from vLLM's loader (bf16)"


CASES = [  # (tp, ep, placement): drawn shapes below
    (2, 1, "linear"), (4, 1, "linear"), (8, 1, "linear"),
    (1, 2, "linear"), (1, 3, "round_robin"), (1, 4, "linear"), (1, 3, "linear"),
]


@pytest.mark.parametrize("tp,ep,placement", CASES)
def test_ranks_equal_vllm_weight_loader(tmp_path, tp, ep, placement):
    rng = random.Random(f"{tp}-{ep}-{placement}")
    group = rng.choice([32, 64, 128])
    # I / tp a multiple of the group and of 64 (Marlin's tile: no padding), H a multiple of 128.
    unit = max(group, 64)
    ipp = unit * rng.randint(1, 3)
    inter, hidden = ipp * tp, 128 * rng.randint(1, 3)
    experts = rng.randint(max(ep, 2), max(ep, 2) + 5)
    src, art = tmp_path / "src", tmp_path / "art"
    subprocess.run([MOEPACK, "synth", str(src), "--format", "gptq", "--layers", "2",
                    "--experts", str(experts), "--hidden", str(hidden), "--inter", str(inter),
                    "--group-size", str(group), "--vocab", "256", "--seed", str(rng.randint(0, 99))],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([MOEPACK, "convert", str(src), str(art), "--vllm-target", "0.33",
                    "--backend", "marlin",
                    "--tensor-parallel-size", str(tp), "--expert-parallel", str(ep),
                    "--expert-placement", placement], check=True, stdout=subprocess.DEVNULL)
    manifest = json.loads((art / "moepack.json").read_text())
    ranks = max(tp, ep)
    assert len(manifest["parallel"]["ranks"]) == ranks
    source = {}
    for f in sorted(src.glob("*.safetensors")):
        source.update(load_file(str(f)))
    for layer in manifest["layers"]:
        module = layer["module"]  # "model.layers.L.mlp"
        for rank in range(ranks):
            loader = vllm_rank_loader(tp, rank, ep, placement, experts, inter)
            want = gptq_rank_params(loader, source, module + ".experts", experts, hidden, ipp,
                                    group)
            if ep > 1:
                assert manifest["parallel"]["ranks"][rank]["experts"] == [
                    g for g in range(experts)
                    if loader.expert_map_manager.map_global_to_local(g) >= 0]
            expect_rank_equal(art, manifest, rank, ranks, want, loader.local_experts, hidden, ipp,
                              layer["param_prefix"])


def test_refuses_what_vllm_refuses(tmp_path):
    """I not a multiple of tp (vLLM's FusedMoEConfig asserts it) and a w2 group straddling two
    ranks: exit 4 naming the reason."""
    src = tmp_path / "src"
    subprocess.run([MOEPACK, "synth", str(src), "--format", "gptq", "--experts", "4", "--hidden",
                    "256", "--inter", "512", "--group-size", "128", "--vocab", "256"],
                   check=True, stdout=subprocess.DEVNULL)
    for tp, words in ((3, "not a multiple of the tensor-parallel size 3"),
                      (8, "would straddle two ranks")):
        r = subprocess.run([MOEPACK, "convert", str(src), str(tmp_path / f"tp{tp}"),
                            "--vllm-target", "0.33", "--backend", "marlin",
                            "--tensor-parallel-size", str(tp)],
                           capture_output=True, text=True)
        assert r.returncode == 4, r.stderr
        assert words in r.stderr


NVFP4_CASES = [(2, 1, "linear"), (4, 1, "linear"), (1, 2, "linear"), (1, 3, "round_robin")]


@pytest.mark.parametrize("tp,ep,placement", NVFP4_CASES)
def test_nvfp4_rank_scale_factor_is_vllms_on_the_rank_slice(tmp_path, tp, ep, placement):
    """marlin-nvfp4 per rank: the block-scale rescale factor 2^k each rank records
    (layers[i].ranks[r].layout_decisions) is what vLLM 0.33's own _nvfp4_compute_scale_factor
    gives on that rank: the compressed-tensors NVFP4 source's block scales loaded by vLLM's
    RoutedExperts.weight_loader for the rank (narrowed by tp_rank, or the rank's experts), in
    the serving dtype, per projection over the rank's local experts (as
    prepare_nvfp4_moe_layer_for_marlin computes it). verify --source then checks the rank's
    bytes against its share of the source with that factor."""
    from vllm.model_executor.layers.quantization.utils.marlin_utils_fp4 import (
        _nvfp4_compute_scale_factor,
    )

    rng = random.Random(f"nvfp4-{tp}-{ep}-{placement}")
    ipp, hidden = 64 * rng.randint(1, 3), 128 * rng.randint(1, 2)
    inter, experts = ipp * tp, rng.randint(max(ep, 2), max(ep, 2) + 4)
    src, art = tmp_path / "src", tmp_path / "art"
    subprocess.run([MOEPACK, "synth", str(src), "--format", "ct-nvfp4", "--layers", "2",
                    "--experts", str(experts), "--hidden", str(hidden), "--inter", str(inter),
                    "--vocab", "256", "--seed", str(rng.randint(0, 99))],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([MOEPACK, "convert", str(src), str(art), "--vllm-target", "0.33",
                    "--target-arch", "sm80", "--backend", "marlin-nvfp4",
                    "--tensor-parallel-size", str(tp), "--expert-parallel", str(ep),
                    "--expert-placement", placement], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([MOEPACK, "verify", str(art), "--source", str(src)], check=True,
                   stdout=subprocess.DEVNULL)
    manifest = json.loads((art / "moepack.json").read_text())
    source = {}
    for f in sorted(src.glob("*.safetensors")):
        source.update(load_file(str(f)))
    factors = set()
    for layer in manifest["layers"]:
        prefix = layer["module"] + ".experts"
        for rank in range(max(tp, ep)):
            loader = vllm_rank_loader(tp, rank, ep, placement, experts, inter)
            E = loader.local_experts
            params = {}
            for stem, shape in (("w13", (E, 2 * ipp, hidden // 16)),
                                ("w2", (E, hidden, ipp // 16))):
                p = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float8_e4m3fn),
                                       requires_grad=False)
                p.quant_method = "group"
                params[stem] = p
            for g in range(experts):
                for proj, shard in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
                    stem = "w2" if shard == "w2" else "w13"
                    loader.weight_loader(params[stem], source[f"{prefix}.{g}.{proj}.weight_scale"],
                                         f"experts.{stem}_weight_scale", shard, g)
            rec = layer["ranks"][rank]["layout_decisions"]
            for stem in ("w13", "w2"):
                sf = _nvfp4_compute_scale_factor(params[stem].data.to(torch.bfloat16),
                                                 torch.bfloat16)
                k = round(torch.log2(torch.tensor(float(sf))).item())
                assert rec[f"{stem}_nvfp4_scale_factor_log2"] == str(k), \
                    f"{layer['module']} rank {rank} {stem}: recorded {rec}, vLLM computes 2^{k}"
                factors.add((layer["module"], stem, k))
    print(f"tp {tp} ep {ep} {placement}: per-rank factors {sorted(factors)}")

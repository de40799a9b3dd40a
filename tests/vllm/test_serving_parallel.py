"""Tensor- and expert-parallel moepack artifacts served by the moepack-vllm plugin in the real
vLLM 0.33.0 on the CPU, two ranks in two processes (tests/vllm/parallel_worker.py).

What runs: a real 2-process gloo group set up by vLLM's own init_distributed_environment /
initialize_model_parallel (its CPU communicator), vLLM's EngineArgs config at
--tensor-parallel-size 2 (and --enable-expert-parallel), vLLM's model class and DefaultModelLoader
with the plugin, per rank. Then, per rank:
  - the parameters the plugin loaded are the rank's tensors of the artifact, byte for byte, and
    vLLM's loader opened no file of the other rank (it read the shared files and its own);
  - they equal what vLLM's own loader puts on that rank from the *source* (stock vLLM 0.33 building
    the GPTQ source at the same degree in the same process group, its RoutedExperts.weight_loader
    narrowing by tp_rank / the expert map): the plugin's Marlin tensors decoded by layouts.py
    (the layout as the Marlin kernel reads it, independent of moepack's C++) equal those codes
    and scales. Stock vLLM cannot pick a WNA16 MoE backend on the CPU, so the source model is
    built with its oracle's pick forced to MARLIN and without process_weights_after_loading (the
    CUDA repack vLLM would then run is what moepack wrote ahead of time; the decode stands for it);
  - the MoE block's forward, with test_serving_forward.py's CPU stand-ins for the CUDA-only Marlin
    ops, gives each rank's partial output; vLLM's all-reduce (gloo) sums them, and the sum matches
    the fp32 reference computed from the source checkpoint.
What does not run: vLLM's engine (LLM / the multiprocessing executor and its scheduler), the CUDA
Marlin kernel, or a GPU. bench/gpu_run.sh's tests/vllm/gpu_parallel_kernel.py runs the shipped
kernel on every rank's tensors on the H100.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from layouts import marlin_codes, unpack_rows, unpermute_scales
from test_serving_forward import RIGHT_TOL, reference

HERE = Path(__file__).resolve().parent
PY = sys.executable
# I = 256: I / 2 = 128 keeps GPTQ's group 128 on one rank (vLLM refuses a straddling group).
SHAPE = dict(inter=256)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(src: Path, dst: Path, out: Path, mode: str, world: int = 2,
              kind: str = "wna16") -> list[dict]:
    """Both ranks, each in its own process, in one gloo group; their results."""
    port = _free_port()
    path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    procs = [subprocess.Popen([PY, str(HERE / "parallel_worker.py"), str(dst), str(src), str(r),
                               str(world), str(port), str(out / f"rank{r}.pt"), mode, kind],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for r in range(world)]
    logs = [p.communicate(timeout=900)[0] for p in procs]
    for r, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {r} failed:\n{log[-6000:]}"
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


def rank_tensors(dst: Path, manifest: dict, rank: int) -> dict:
    t = {}
    for f in manifest["parallel"]["ranks"][rank]["shards"]:
        t.update(load_file(str(dst / f)))
    return t


def check_rank(dst: Path, manifest: dict, res: dict, rank: int, world: int) -> int:
    """The plugin's loaded parameters are the rank's tensors, and only its files were read."""
    tag = f"rank{rank:02d}-of-{world:02d}/"
    assert res["rank"] == rank
    mine = set(manifest["parallel"]["ranks"][rank]["shards"])
    others = {f for r, x in enumerate(manifest["parallel"]["ranks"]) if r != rank
              for f in x["shards"]}
    opened = {Path(f).name for f in res["files"]}
    assert mine <= opened, f"rank {rank} did not read its files {sorted(mine)}: {sorted(opened)}"
    assert not opened & others, f"rank {rank} read another rank's files {sorted(opened & others)}"
    tensors = rank_tensors(dst, manifest, rank)
    checked = 0
    for layer in manifest["layers"]:
        for name in layer["params"]:
            if not name.startswith(tag):
                continue
            local = name[len(tag) + len(layer["param_prefix"]):]
            got = res["params"][f"{layer['module']}.experts.routed_experts.{local}"]
            want = tensors[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got.contiguous().view(torch.uint8),
                               want.contiguous().view(torch.uint8)), f"{name}: bytes differ"
            checked += 1
    assert checked > 0
    return checked


def check_against_vllm_source(manifest: dict, res: dict) -> int:
    """The plugin's tensors of the rank decode to what stock vLLM loaded on that rank."""
    checked = 0
    for layer in manifest["layers"]:
        base = f"{layer['module']}.experts.routed_experts."
        got, src = res["params"], res["source"]
        E = src[base + "w13_qweight"].shape[0]
        for stem, K, N in (("w13_", layer["hidden"], src[base + "w13_qweight"].shape[2]),
                           ("w2_", src[base + "w2_qweight"].shape[1] * 8, layer["hidden"])):
            codes = torch.stack([marlin_codes(got[base + stem + "qweight"][e], 4, K, N)
                                 for e in range(E)])
            scales = torch.stack([unpermute_scales(got[base + stem + "scales"][e])
                                  for e in range(E)])
            want = torch.stack([unpack_rows(src[base + stem + "qweight"][e], 4) for e in range(E)])
            assert torch.equal(codes, want), f"{base}{stem}: codes differ from vLLM's loader"
            ws = src[base + stem + "scales"].to(torch.bfloat16)
            assert torch.equal(scales.view(torch.int16), ws.view(torch.int16)), \
                f"{base}{stem}: scales differ from vLLM's loader"
            checked += 1
    return checked


def check_forward(src: Path, manifest: dict, results: list[dict]) -> float:
    """The all-reduced output: the sum of the ranks' partials, equal on every rank, and the
    source's fp32 reference for the experts and weights the router chose."""
    y0 = results[0]["y"]
    partial_sum = sum(r["partial"][-1] for r in results)
    for r in results:
        assert torch.equal(r["x"], results[0]["x"])
        assert torch.equal(r["y"], y0), "the ranks' all-reduced outputs differ"
    assert float((partial_sum - y0).norm() / y0.norm()) < 1e-2, "all-reduce is not the sum"
    L = manifest["layers"][0]
    ref = reference(src, L["module"] + ".experts", "gptq", 4, results[0]["x"],
                    results[0]["topk_ids"], results[0]["topk_weights"],
                    ("gate_proj", "up_proj", "down_proj"))
    err = float((y0 - ref).norm() / ref.norm())
    for r in results:  # each rank's share alone is not the answer
        assert float((r["partial"][-1] - ref).norm() / ref.norm()) > 10 * err
    return err


@pytest.mark.parametrize("mode,flags,world,shape", [
    ("tp", ("--tensor-parallel-size", "2"), 2, SHAPE),
    ("ep", ("--expert-parallel", "2", "--expert-placement", "linear"), 2, SHAPE),
    # Four processes in one gloo group (I = 512: I / 4 = 128 keeps the group on one rank).
    ("tp", ("--tensor-parallel-size", "4"), 4, {"inter": 512}),
], ids=["tp2", "ep2", "tp4"])
def test_parallel_artifact_served_per_rank(artifacts, tmp_path, mode, flags, world, shape):
    src, dst = artifacts.get("gptq", "qwen3", "--backend", "marlin", *flags, **shape)
    manifest = json.loads((dst / "moepack.json").read_text())
    results = run_ranks(src, dst, tmp_path, mode, world=world)
    for rank, res in enumerate(results):
        n = check_rank(dst, manifest, res, rank, world)
        m = check_against_vllm_source(manifest, res)
        print(f"{mode} rank {rank}: {n} parameters byte-identical to its files, {m} decoded equal "
              f"to vLLM's own loading of the source; files read: "
              f"{sorted(Path(f).name for f in res['files'])}")
    err = check_forward(src, manifest, results)
    print(f"{mode}: all-reduced MoE output vs the source's fp32 reference: {err:.3e}")
    assert err < RIGHT_TOL


def test_round_robin_artifact_where_vllm_places_linearly_is_refused(artifacts, tmp_path):
    """vLLM 0.33 keeps round_robin placement only for models with expert groups (Qwen3 has none:
    determine_expert_placement_strategy falls back to linear); the rank's tensors hold other
    experts than vLLM's expert map, and the plugin refuses naming both."""
    src, dst = artifacts.get("gptq", "qwen3", "--backend", "marlin", "--expert-parallel", "2",
                             "--expert-placement", "round_robin", **SHAPE)
    with pytest.raises(AssertionError, match=r"round_robin placement\), vLLM's expert map puts"):
        run_ranks(src, dst, tmp_path, "ep-round_robin")


@pytest.mark.parametrize("fmt,arch,backend,synth", [
    # DeepSeek FP8 block: vLLM's own Fp8MoEMethod on MARLIN (path a) per rank; I / 2 = 128.
    ("fp8-block", "sm80", "marlin-fp8", {"inter": 256}),
    # ModelOpt MXFP8: the marlin-float builder (path b); I / 2 = 96, padded to 128 per rank.
    ("modelopt-mxfp8", "sm89", "marlin-mxfp8", {"inter": 192}),
    # NVFP4: each rank's block-scale rescale factor 2^k from its own slice (and its processed
    # global scales divided by it); ModelOpt I / 2 = 96 padded to 128 per rank.
    ("modelopt-nvfp4", "sm80", "marlin-nvfp4", {"inter": 192}),
    ("ct-nvfp4", "sm86", "marlin-nvfp4", {"inter": 256}),
])
def test_float_marlin_tensor_parallel_served_per_rank(artifacts, tmp_path, fmt, arch, backend,
                                                      synth):
    """The float Marlin rows at --tensor-parallel-size 2, with test_serving_marlin_float.py's
    stand-ins and vLLM config edits (its BF16 Linears ignored by the source block)."""
    from test_serving_marlin_float import ignore_bf16_linears_in
    from test_serving_marlin_float import reference as float_reference

    src, dst = artifacts.get(fmt, "qwen3", "--target-arch", arch, "--backend", backend,
                             "--tensor-parallel-size", "2", **synth)
    field = "ignored_layers" if fmt == "fp8-block" else "ignore"
    s = artifacts.edited_copy(src, f"tp-{fmt}-src")
    d = artifacts.edited_copy(dst, f"tp-{fmt}-art")
    ignore_bf16_linears_in(s, False, field)
    ignore_bf16_linears_in(d, True, field)
    manifest = json.loads((d / "moepack.json").read_text())
    results = run_ranks(s, d, tmp_path, "tp", kind="float")
    for rank, res in enumerate(results):
        check_rank(d, manifest, res, rank, 2)
    y0 = results[0]["y"]
    assert all(torch.equal(r["y"], y0) for r in results)
    L = manifest["layers"][0]
    ref = float_reference(s, L["module"] + ".experts", fmt, results[0]["x"],
                          results[0]["topk_ids"], results[0]["topk_weights"])
    err = float((y0 - ref).norm() / ref.norm())
    print(f"{fmt} -> {backend} at TP 2: all-reduced MoE output vs the source: {err:.3e}")
    assert err < RIGHT_TOL
    for r in results:
        assert float((r["partial"][-1] - ref).norm() / ref.norm()) > 10 * err


@pytest.mark.parametrize("mode,flags,experts_cls", [
    ("tp", ("--tensor-parallel-size", "2"), "HummingIndexedExperts"),
    ("ep", ("--expert-parallel", "2", "--expert-placement", "linear"), "HummingGroupedExperts"),
])
def test_humming_artifact_served_per_rank(artifacts, tmp_path, mode, flags, experts_cls):
    """sm90's default layout (humming) at TP 2 / EP 2, two processes in one gloo group, with
    test_serving_humming.py's stubs and humming's CUDA weight kernels emulated on the CPU
    (bench/humming/humming_emu.py). Per rank: the plugin loads the rank's files only, byte for
    byte; stock vLLM 0.33 building the GPTQ *source* at the same degree (its loader's narrowing,
    its sm90 pick HUMMING with the experts class its oracle takes for the deployment, its own
    Humming post-processing of the rank's slice) holds the same tensors, byte for byte, and the
    same LayerConfig strings, which are the rank's record in moepack.json (layers[i].ranks[r]);
    the plugin serves the layer with vLLM's Humming experts of that class. No forward: humming's
    kernels are JIT-compiled for a GPU."""
    src, dst = artifacts.get("gptq", "qwen3", *flags, **SHAPE)
    manifest = json.loads((dst / "moepack.json").read_text())
    assert manifest["backend"] == "humming"
    results = run_ranks(src, dst, tmp_path, mode, kind="humming")
    for rank, res in enumerate(results):
        n = check_rank(dst, manifest, res, rank, 2)
        compared = 0
        for L in manifest["layers"]:
            base = f"{L['module']}.experts.routed_experts."
            tag = f"rank{rank:02d}-of-02/{L['param_prefix']}"
            for name in L["params"]:
                if not name.startswith(tag):
                    continue
                got, want = res["params"][base + name[len(tag):]], res["source"][base +
                                                                                  name[len(tag):]]
                assert got.dtype == want.dtype and got.shape == want.shape, name
                assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), \
                    f"{name}: differs from stock vLLM's Humming post-processing on rank {rank}"
                compared += 1
            rec = L["ranks"][rank]["layout_config"]
            stock = res["source"][base.rstrip(".") + ".humming_configs"]
            for sub in ("w13", "w2"):
                assert rec[f"{sub}_layer_config"] == stock[sub], f"{L['module']} {sub}"
        first = manifest["layers"][0]["ranks"][rank]["layout_config"]
        assert res["humming_configs"] == {s: first[f"{s}_layer_config"] for s in ("w13", "w2")}
        assert res["experts_cls"] == experts_cls
        print(f"humming {mode} rank {rank}: {n} parameters byte-identical to its files, "
              f"{compared} equal to stock vLLM's own Humming post-processing of the source on "
              f"the rank; served by {res['experts_cls']}")

"""Humming's tuning tables stored in the artifact (issue 23 item 5), in the real vLLM 0.33.0 and
humming-kernels 0.1.19 on the CPU (`pretend_hopper`: humming's DeviceInfo answers an H100's
values, see test_serving_humming.py).

`moepack-vllm seed-tuning DIR --gpu h100-sxm` computes the tables on the CPU for the named GPU;
at load the plugin hands them to vLLM's HummingIndexedExperts instead of humming's
get_heuristics_config (~2.5 s per sublayer shape on an H100), only where humming's version, the
flags and every recorded DeviceInfo field are this process's.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys

import pytest

import vllm_harness as h
from test_serving_humming import moepack_layers, pretend_hopper  # noqa: F401

# `moepack-vllm seed-tuning` is this module's main (pyproject [project.scripts]); run as a module
# so the test does not depend on which checkout installed the venv's console script.
CLI = [sys.executable, "-m", "moepack_vllm.humming_tuning"]


@pytest.fixture
def count_heuristics(monkeypatch):
    """Counts humming's own table computations (the call vLLM's experts make at build)."""
    import humming.tune as ht

    real = ht._get_heuristics_config
    calls = []

    def counted(*a, **k):
        calls.append(a[0].to_str())
        return real(*a, **k)

    counted.cache_clear = real.cache_clear
    monkeypatch.setattr(ht, "_get_heuristics_config", counted)
    real.cache_clear()
    return calls


def seeded_copy(artifacts, name, *gpu):
    _, dst = artifacts.get("gptq", "qwen3")
    d = artifacts.edited_copy(dst, name)
    r = subprocess.run([*CLI, "seed-tuning", str(d), *gpu], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return d, json.loads((d / "humming_tuning.json").read_text())


def humming_own(layer_config: str):
    """humming's public get_heuristics_config for vLLM's flags, on the (pretended) H100."""
    import humming.tune as ht
    from humming.config import GemmType, LayerConfig

    ht._get_heuristics_config.cache_clear()
    return json.loads(json.dumps(ht.get_heuristics_config(
        layer_config=LayerConfig(**json.loads(layer_config)), use_f16_accum=False,
        use_batch_invariant=False, gemm_type=GemmType.INDEXED)))


def test_seeded_tables_equal_humming_and_skip_its_call(plugin, artifacts, pretend_hopper,
                                                       count_heuristics):
    d, doc = seeded_copy(artifacts, "tuning-seeded", "--gpu", "h100-sxm")
    m = json.loads((d / "moepack.json").read_text())
    wanted = {L["layout_config"][f"{sub}_layer_config"] for L in m["layers"] for sub in ("w13", "w2")}
    assert set(doc["tables"]) == wanted and doc["gpu"] == "h100-sxm"
    assert doc["kernel_version"] == "0.1.19"
    assert doc["flags"] == {"use_f16_accum": False, "use_batch_invariant": False,
                            "gemm_type": "indexed"}
    for lc, table in doc["tables"].items():
        assert table and table == humming_own(lc)
    count_heuristics.clear()

    model, _ = h.load_model(str(d))
    assert count_heuristics == []  # humming's ~2.5 s computation never ran
    for (_, mod), L in zip(sorted(moepack_layers(model).items()), m["layers"]):
        experts = mod.quant_method.moe_kernel.fused_experts
        for sub, got in (("w13", experts.w13_tuning_config), ("w2", experts.w2_tuning_config)):
            assert got == doc["tables"][L["layout_config"][f"{sub}_layer_config"]]
        assert json.loads(experts.w13_tuning_config_str) == experts.w13_tuning_config

    # the same artifact without the file: vLLM computes them (the counter does count)
    (d / "humming_tuning.json").unlink()
    h.load_model(str(d))
    assert set(count_heuristics) == wanted


def test_other_gpu_tables_are_computed_as_stock(plugin, artifacts, pretend_hopper,
                                               count_heuristics, caplog):
    d, doc = seeded_copy(artifacts, "tuning-other-gpu")
    doc["device"]["sm_count"] = 114  # e.g. an H100 PCIe
    poisoned = {lc: [[0, 1, {"block_shape": [1, 1, 1]}]] for lc in doc["tables"]}
    (d / "humming_tuning.json").write_text(json.dumps({**doc, "tables": poisoned}))
    count_heuristics.clear()
    with caplog.at_level(logging.WARNING, logger="moepack_vllm"):
        model, _ = h.load_model(str(d))
    assert count_heuristics, "stored tables of another GPU were used"
    assert any(re.search(r"humming_tuning.json not used \(computed for h100-sxm \(sm_count "
                         r"114\), this GPU has sm_count 132\)", r.getMessage())
               for r in caplog.records)
    for _, mod in moepack_layers(model).items():
        experts = mod.quant_method.moe_kernel.fused_experts
        got = json.loads(json.dumps(experts.w13_tuning_config))  # humming's tuples as lists
        assert got == humming_own(mod.humming_configs["w13"].to_str())


@pytest.mark.parametrize("edit,why", [
    (lambda d: d["device"].update(name="NVIDIA H20"),
     r"name 'NVIDIA H20'\), this GPU has name 'NVIDIA H100 80GB HBM3'"),
    (lambda d: d.update(kernel_version="0.1.18"), r"humming-kernels 0.1.18, this is 0.1.19"),
    (lambda d: d["flags"].update(use_f16_accum=True), r"vLLM asks"),
], ids=["h20", "version", "flags"])
def test_mismatch_reasons(pretend_hopper, edit, why):
    from moepack_vllm import humming_tuning as t

    doc = {"format": t.FORMAT, "kernel_version": "0.1.19", "gpu": "h100-sxm",
           "device": dict(t.GPUS["h100-sxm"]), "flags": t._flags()}
    assert t._mismatch(doc, t._flags()) is None
    edit(doc)
    assert re.search(why, t._mismatch(doc, t._flags()))


def test_seed_tuning_refuses_a_marlin_artifact(artifacts):
    _, dst = artifacts.get("gptq", "qwen3", "--backend", "marlin")
    r = subprocess.run([*CLI, "seed-tuning", str(dst)], capture_output=True, text=True)
    assert r.returncode != 0 and "not humming" in r.stderr
    assert not (dst / "humming_tuning.json").exists()

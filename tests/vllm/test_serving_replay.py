"""The plugin's serving calls on the float Marlin layouts, recorded in the real vLLM 0.33.0 for
the H100 (serving_record.py says why the device runs a record, not vLLM).

For each case of test_serving_marlin_float.py the plugin loads the artifact and vLLM's whole MoE
block runs on the CPU stand-ins; every `moe_wna16_marlin_gemm` call is recorded with its exact
arguments (the plugin's parameters as loaded, the quantisation type vLLM chose, sizes, flags,
routing) together with the activation vLLM applies and an fp32 reference from the *source*.
Here the record is replayed through the CPU stand-in and must give the block's own output (the
record is complete) and the source's MoE; with MOEPACK_REPLAY_OUT set, the records are written
there for tests/vllm/gpu_replay.py, which replays them on the wheel's shipped kernel.

gpt-oss (`gpt-oss`, marlin-mxfp4 with biases) is recorded like the others: the biases travel as
the calls' `b_bias` operands, the activation is SWIGLUOAI, and the first call's input is the
hidden states as vLLM's runner padded them to Hp (the replay cuts the output back to H).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from serving_record import bind_gemm_call, replay
from test_serving_forward import RIGHT_TOL
from test_serving_marlin_float import (CASES, FloatStandIns, artifact, pretend_ampere,  # noqa: F401
                                       reference, run_block)


class RecordingStandIns(FloatStandIns):
    """FloatStandIns that also record every GEMM call and the activation between them."""

    def __init__(self, monkeypatch):
        import vllm._custom_ops as ops
        from vllm.model_executor.layers.fused_moe.experts import marlin_moe

        wrapper = ops.moe_wna16_marlin_gemm  # vLLM's own, for its signature
        super().__init__(monkeypatch)
        self.gemms: list[dict] = []
        self.activations: list[str] = []
        compute, act = self.gemm, self.activation

        def gemm(*args, **kwargs):
            self.gemms.append(bind_gemm_call(wrapper, args, kwargs))
            return compute(*args, **kwargs)

        def activation(experts, activation, output, input, **kw):
            self.activations.append(activation.name)
            return act(experts, activation, output, input, **kw)

        monkeypatch.setattr(ops, "moe_wna16_marlin_gemm", gemm)
        monkeypatch.setattr(marlin_moe.MarlinExperts, "activation", activation)


def cpu_gemm(*args):
    """The CPU stand-in with the op's positional signature (the type as its id)."""
    from vllm.scalar_type import ScalarType

    args = list(args)
    args[16] = ScalarType.from_id(args[16])
    return FloatStandIns.gemm(type("Cache", (), {"cache": {}})(), *args)


def record_case(plugin, artifacts, monkeypatch, fmt) -> dict:
    _, layout, *_ = CASES[fmt]
    src, dst = artifact(artifacts, fmt)
    monkeypatch.setattr("test_serving_marlin_float.FloatStandIns", RecordingStandIns)
    model, manifest, y, x, stand, prefix = run_block(plugin, monkeypatch, src, dst)
    assert isinstance(stand, RecordingStandIns)
    assert len(stand.gemms) == 2 and len(set(stand.activations)) == 1, \
        (len(stand.gemms), stand.activations)
    return {"case": fmt, "layout": layout, "vllm": "0.33.0", "tokens": x.shape[0],
            "hidden": x.shape[1], "activation": stand.activations[0], "gemms": stand.gemms,
            "y": y, "ref": reference(src, prefix, fmt, x, stand.topk_ids, stand.topk_weights)}


@pytest.mark.parametrize("fmt", list(CASES))
def test_serving_calls_recorded_and_replayed(plugin, artifacts, monkeypatch, pretend_ampere,  # noqa: F811
                                            fmt):
    rec = record_case(plugin, artifacts, monkeypatch, fmt)
    if fmt == "gpt-oss":  # what the device must see: padded input, biases, swigluoai
        g1, g2 = rec["gemms"]
        assert rec["activation"] == "SWIGLUOAI" and g1["b_bias"] is not None and \
            g2["b_bias"] is not None
        assert (g1["size_k"], g2["size_n"], rec["hidden"]) == (256, 256, 64)
        assert g1["input"].shape == (rec["tokens"], 256) and g1["input"][:, 64:].eq(0).all()
    out = replay(rec, cpu_gemm)
    # The record holds everything the block computed with: replaying it gives the block's output
    # (the same stand-in, the same bf16 roundings) and the source's MoE.
    assert torch.allclose(out, rec["y"], rtol=0, atol=1e-2 * float(rec["y"].abs().max())), fmt
    err = float((out - rec["ref"]).norm() / rec["ref"].norm())
    assert err < RIGHT_TOL, f"{fmt}: replay |y - ref| / |ref| = {err:.3e}"
    dest = os.environ.get("MOEPACK_REPLAY_OUT")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        torch.save(rec, Path(dest) / f"{fmt}.pt")

"""On the H100: the plugin's serving calls, recorded in the real vLLM 0.33.0 on the CPU
(test_serving_replay.py), replayed on the 0.33.0 wheel's shipped `moe_wna16_marlin_gemm`.

    python3 tests/vllm/gpu_replay.py MOE_C_SO RECORDS_DIR [--json OUT]

Each record is one MoE block's two GEMM calls with vLLM's exact arguments (the plugin's
parameters as loaded, quantisation type, sizes, flags, routing); the activation and the top-k sum
are recomputed from the kernel's own output (serving_record.replay). Passes when every case
lands within bf16 rounding of the fp32 MoE computed from the source checkpoint, and every
corruption (w13's gate and up halves exchanged in weights and scales; NVFP4's processed global
scales dropped; gpt-oss' biases dropped, the kernel's b_bias zero) lands far off.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_record import replay  # noqa: E402

RIGHT_TOL = 2e-2  # as the CPU tests: bf16 activations and intermediates, ~4e-3 expected
WRONG_MIN = 0.2
# The tiny gpt-oss' biases are small beside its expert outputs: dropping them moves its MoE by
# 0.13-0.14 on the H100 (bench/gpu_marlin_float.py), 0.10 in the CPU test; 0.05 is 2.5x RIGHT_TOL.
WRONG_MIN_OF = {"biases_dropped": 0.05}


def swap_halves(t: torch.Tensor) -> torch.Tensor:
    half = t.shape[-1] // 2
    raw = t.view(torch.uint8) if t.element_size() == 1 else t
    out = torch.cat([raw[..., half:], raw[..., :half]], -1).contiguous()
    return out.view(t.dtype) if t.element_size() == 1 else out


def corruptions(rec: dict) -> dict:
    g1 = rec["gemms"][0]
    out = {"gate_up_swapped": {"w13": {"b_qweight": swap_halves(g1["b_qweight"]),
                                       "b_scales": swap_halves(g1["b_scales"])}}}
    if g1["b_bias"] is not None:
        g2 = rec["gemms"][1]
        out["biases_dropped"] = {"w13": {"b_bias": torch.zeros_like(g1["b_bias"])},
                                 "w2": {"b_bias": torch.zeros_like(g2["b_bias"])}}
    if g1["global_scale"] is not None:
        g2 = rec["gemms"][1]
        out["global_scale_dropped"] = {
            "w13": {"global_scale": torch.ones_like(g1["global_scale"])},
            "w2": {"global_scale": torch.ones_like(g2["global_scale"])}}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("moe_so")
    ap.add_argument("records")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.ops.load_library(a.moe_so)
    op = torch.ops._moe_C.moe_wna16_marlin_gemm
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results, ok = [], True
    for path in sorted(Path(a.records).glob("*.pt")):
        rec = torch.load(path, weights_only=True)
        ws = torch.zeros(sms * 4, dtype=torch.int32, device="cuda")  # vLLM's Marlin workspace

        def err_of(weights=None):
            y = replay(rec, op, "cuda", ws, weights)
            torch.cuda.synchronize()
            return float((y - rec["ref"]).norm() / rec["ref"].norm())

        err = err_of()
        bad = {name: err_of(w) for name, w in corruptions(rec).items()}
        passed = err < RIGHT_TOL and all(e > WRONG_MIN_OF.get(k, WRONG_MIN)
                                         for k, e in bad.items())
        ok &= passed
        g1 = rec["gemms"][0]
        results.append({"case": rec["case"], "layout": rec["layout"], "err": err,
                        "corruptions": bad, "passed": passed, "b_q_type": g1["b_q_type"],
                        "act_dtype": str(g1["input"].dtype), "size_n_k": [g1["size_n"],
                                                                         g1["size_k"]]})
        print(f"{'ok  ' if passed else 'FAIL'} {rec['case']:<16} {rec['layout']:<13} "
              f"err {err:.3e}  " + "  ".join(f"{k} {v:.3f}" for k, v in bad.items()), flush=True)
    if not results:
        print(f"no records under {a.records}")
        return 2
    print(f"{sum(r['passed'] for r in results)}/{len(results)} cases pass on "
          f"{torch.cuda.get_device_name(0)}")
    if a.json:
        Path(a.json).write_text(json.dumps({"device": torch.cuda.get_device_name(0),
                                            "torch": torch.__version__, "cases": results},
                                           indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

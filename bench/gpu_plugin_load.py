"""What serving a moepack float Marlin artifact costs at start-up on the GPU, per MoE layer, against
stock vLLM 0.33 (issue 24 item 9; bench/RESULTS.md).

Stock vLLM loads the checkpoint's tensors into its parameters and then runs
prepare_{nvfp4,mxfp8}_moe_layer_for_marlin on the GPU (measured by the fpmarlin device run,
postproc_bench.py: time and transient peak above the loaded layer). The moepack-vllm plugin loads
the artifact's tensors into parameters of their final shapes and its process_weights_after_loading
transforms no tensor (path a: vLLM's method under weights_already_processed(); path b: a kernel
builder), so its post-processing is the kernel object only. This script measures both loads the
way vLLM's loader does them -- each parameter allocated on the device, then copy_ from a host
tensor -- for Qwen3-30B-A3B's MoE layer (E 128, H 2048, I 768, bf16), 48 layers: time, and the peak
allocated above the parameters (the transient), for the checkpoint's tensors (what stock loads
before post-processing) and for the artifact's (what the plugin loads, and all it holds).

  python3 gpu_plugin_load.py [--layers 48] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

E, H, I = 128, 2048, 768  # Qwen3-30B-A3B: 128 experts, hidden 2048, moe_intermediate_size 768


def shapes(family: str, form: str) -> dict:
    """name -> (dtype, shape) of one layer: the checkpoint's (stacked per projection, as vLLM's
    parameters hold them before post-processing) or the artifact's (docs/marlin_float.md)."""
    u8, i32, f32, bf = torch.uint8, torch.int32, torch.float32, torch.bfloat16
    ip = I  # I = 768 needs no padding for either family at H = 2048
    if family == "nvfp4" and form == "checkpoint":
        return {"w13_weight": (u8, (E, 2 * I, H // 2)), "w2_weight": (u8, (E, H, I // 2)),
                "w13_weight_scale": (u8, (E, 2 * I, H // 16)),
                "w2_weight_scale": (u8, (E, H, I // 16)),
                "w13_weight_scale_2": (f32, (E, 2)), "w2_weight_scale_2": (f32, (E,)),
                "w13_input_scale": (f32, (E, 2)), "w2_input_scale": (f32, (E,))}
    if family == "nvfp4":
        return {"w13_weight": (i32, (E, H // 16, 4 * ip)), "w2_weight": (i32, (E, ip // 16, 2 * H)),
                "w13_weight_scale": (u8, (E, H // 16, 2 * ip)),
                "w2_weight_scale": (u8, (E, ip // 16, H)),
                "w13_weight_scale_2": (f32, (E,)), "w2_weight_scale_2": (f32, (E,))}
    if form == "checkpoint":  # mxfp8
        return {"w13_weight": (u8, (E, 2 * I, H)), "w2_weight": (u8, (E, H, I)),
                "w13_weight_scale": (u8, (E, 2 * I, H // 32)),
                "w2_weight_scale": (u8, (E, H, I // 32))}
    return {"w13_weight": (i32, (E, H // 16, 8 * ip)), "w2_weight": (i32, (E, ip // 16, 4 * H)),
            "w13_weight_scale": (u8, (E, H // 32, 2 * ip)),
            "w2_weight_scale": (u8, (E, ip // 32, H))}


def host_tensors(spec: dict) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {}
    for name, (dt, shp) in spec.items():
        n = 1
        for d in shp:
            n *= d
        nbytes = n * torch.empty((), dtype=dt).element_size()
        out[name] = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g).view(dt) \
            .reshape(shp).pin_memory()
    return out


def load(family: str, form: str, layers: int) -> dict:
    host = host_tensors(shapes(family, form))
    nbytes = sum(t.numel() * t.element_size() for t in host.values())
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    kept, times = [], []
    for _ in range(layers):
        t0 = time.perf_counter()
        params = {n: torch.empty(t.shape, dtype=t.dtype, device="cuda") for n, t in host.items()}
        for n, t in host.items():
            params[n].copy_(t, non_blocking=False)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        kept.append(params)
    held = torch.cuda.memory_allocated() - base
    peak = torch.cuda.max_memory_allocated() - base
    del kept
    torch.cuda.empty_cache()
    return {"family": family, "form": form, "layers": layers, "layer_MiB": nbytes / 2**20,
            "ms_per_layer": 1e3 * sum(times) / layers, "max_ms": 1e3 * max(times),
            "held_MiB": held / 2**20, "peak_MiB": peak / 2**20,
            "transient_MiB": (peak - held) / 2**20}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--json")
    args = ap.parse_args()
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    recs = []
    for family in ("nvfp4", "mxfp8"):
        for form in ("checkpoint", "artifact"):
            r = load(family, form, args.layers)
            recs.append(r)
            print(f"{family} {form:10s}: {r['layers']} layers x E{E} H{H} I{I}: load "
                  f"{r['ms_per_layer']:.2f} ms/layer (max {r['max_ms']:.2f}); layer "
                  f"{r['layer_MiB']:.1f} MiB, held {r['held_MiB']:.0f} MiB, transient above "
                  f"the parameters {r['transient_MiB']:.1f} MiB", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(recs, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

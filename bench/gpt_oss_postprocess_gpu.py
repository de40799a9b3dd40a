#!/usr/bin/env python3
"""gpt-oss start-up on the GPU: vLLM 0.33.0's own MXFP4 MoE post-processing against the plugin's,
at gpt-oss-120b's shape by default (36 MoE layers x 128 experts, H = I = 2880). Issue 26 item 6;
bench/gpt_oss_postprocess_gpu.sh prepares the carry and runs it; results in bench/RESULTS.md.

What runs, per path, as vLLM runs it after loading (the whole model's expert tensors on the GPU
first, then `process_weights_after_loading` layer by layer, each layer's outputs kept and its
loaded tensors freed):

  vllm-triton   GptOssMxfp4MoEMethod with Mxfp4MoeBackend.TRITON (vLLM 0.33's pick on sm90):
                convert_gpt_oss_weight_to_mxfp4_moe_kernel_format's TRITON branch (_swizzle_mxfp4
                with the vendored triton_kernels, the float32 biases), executed from the carried
                vLLM source files (bench/gpu_triton_mxfp4.py's load_vllm), on the loaded
                parameters of the padded sizes vLLM creates (Ip = I rounded up to 64)
  vllm-marlin   the same method with Mxfp4MoeBackend.MARLIN (`--moe-backend marlin`): the MARLIN
                branch, marlin_utils_fp4.prepare_moe_mxfp4_layer_for_marlin (per expert
                gptq_marlin_repack -- the wheel's shipped op from _C_stable_libtorch.abi3.so --,
                marlin_permute_scales, mxfp4_marlin_process_scales, marlin_permute_bias), from the
                carried marlin_utils_fp4.py / marlin_utils.py / _custom_ops.py functions, on
                Hp = H rounded up to 256, Ip = I rounded up to 128
  plugin-triton moepack-vllm on a triton-mxfp4 artifact: its swizzled buffers wrapped as the
                triton_kernels Tensors and PrecisionConfigs vLLM's TRITON branch leaves (the
                plugin's wrap_triton_mxfp4 when integrations/vllm/moepack_vllm/triton_mxfp4.py
                exists, else the same triton_kernels calls here); no byte moves
  plugin-marlin moepack-vllm on a marlin-mxfp4 artifact: the loaded tensors become the layer's
                parameters as they are (the marlin-float builder's load); no byte moves

Inputs are random, well-formed bytes (codes any byte, E8M0 scales 117..123, bf16 biases; the
padding zero as the loader leaves it), made on the GPU outside the timed region.

Printed per layer: seconds (cuda-synchronized) and `transient` = torch.cuda.max_memory_allocated
during the layer minus memory_allocated before it (the loaded model, the layers done so far
included), i.e. the peak above the layer's loaded weights; per path the 36-layer totals: seconds,
the largest transient, peak allocated above the loaded model, and the memory the layers hold
after (outputs).

  python3 gpt_oss_postprocess_gpu.py --carry DIR --so C.so [--layers 36 --E 128 --H 2880
      --I 2880] [--paths vllm-triton,vllm-marlin,plugin-triton,plugin-marlin] [--json OUT]
  --cpu-selftest: small shapes on the CPU, capability faked as sm90, the repack op replaced by a
      shape-only stand-in (checks this script's plumbing, measures nothing)
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import gpu_triton_mxfp4 as gtm  # noqa: E402  (load_vllm: vLLM's TRITON functions, carried)

DEV = "cuda"
GiB = float(1 << 30)


def _extract(ns: dict, path: str, functions: set[str]) -> None:
    """Executes the named top-level functions of one of vLLM's files (its text, via the AST)."""
    tree = ast.parse(open(path).read())
    found = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in functions:
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), ns)
            found.add(node.name)
    missing = functions - found
    if missing:
        raise SystemExit(f"{path}: no top-level {sorted(missing)} (not vLLM 0.33.0's file?)")


class _Envs:
    VLLM_MARLIN_INPUT_DTYPE = None  # vLLM's default: bf16 activations through Marlin


def load_vllm_marlin(carry: str, repack_fn) -> dict:
    """vLLM 0.33.0's MXFP4 Marlin MoE preparation from the carried files, `ops` answering with
    _custom_ops.gptq_marlin_repack (which calls torch.ops._C.gptq_marlin_repack)."""
    src = os.path.join(carry, "vllm_src")
    ops_ns = {"torch": torch}
    _extract(ops_ns, os.path.join(src, "_custom_ops.py"), {"gptq_marlin_repack"})
    if repack_fn is not None:  # --cpu-selftest only
        ops_ns["gptq_marlin_repack"] = repack_fn
    ops = type("ops", (), {"gptq_marlin_repack": staticmethod(ops_ns["gptq_marlin_repack"])})
    ns = {"torch": torch, "ops": ops, "envs": _Envs, "current_platform": gtm.Platform()}
    _extract(ns, os.path.join(src, "marlin_utils.py"),
             {"get_scale_perms", "marlin_permute_scales", "marlin_permute_bias",
              "get_marlin_input_dtype"})
    _extract(ns, os.path.join(src, "marlin_utils_fp4.py"),
             {"_repack_marlin_experts", "mxfp4_marlin_process_scales",
              "prepare_moe_mxfp4_layer_for_marlin"})
    return ns


def selftest_repack(b_q_weight, size_k, size_n, num_bits, is_a_8bit=False):
    """Shape-only stand-in for the CUDA op (--cpu-selftest): Marlin's [K/16, N*16/pack] int32."""
    return torch.zeros(size_k // 16, size_n * 16 * num_bits // 32, dtype=torch.int32,
                       device=b_q_weight.device)


def rand_u8(shape, lo, hi, g):
    return torch.randint(lo, hi, shape, dtype=torch.uint8, device=DEV, generator=g)


def loaded_layer(E, H, I, Hp, Ip, g):
    """The six parameters vLLM's create_weights + gpt-oss loader leave (TP 1): zeros of the padded
    sizes with the checkpoint's [E, 2I, H/2] / [E, H, I/2] bytes in the leading rows/columns."""
    t = {"w13_weight": torch.zeros(E, 2 * Ip, Hp // 2, dtype=torch.uint8, device=DEV),
         "w13_weight_scale": torch.zeros(E, 2 * Ip, Hp // 32, dtype=torch.uint8, device=DEV),
         "w13_bias": torch.zeros(E, 2 * Ip, dtype=torch.bfloat16, device=DEV),
         "w2_weight": torch.zeros(E, Hp, Ip // 2, dtype=torch.uint8, device=DEV),
         "w2_weight_scale": torch.zeros(E, Hp, Ip // 32, dtype=torch.uint8, device=DEV),
         "w2_bias": torch.zeros(E, Hp, dtype=torch.bfloat16, device=DEV)}
    t["w13_weight"][:, :2 * I, :H // 2] = rand_u8((E, 2 * I, H // 2), 0, 256, g)
    t["w13_weight_scale"][:, :2 * I, :H // 32] = rand_u8((E, 2 * I, H // 32), 117, 124, g)
    t["w13_bias"][:, :2 * I] = torch.randn(E, 2 * I, device=DEV, generator=g).to(torch.bfloat16)
    t["w2_weight"][:, :H, :I // 2] = rand_u8((E, H, I // 2), 0, 256, g)
    t["w2_weight_scale"][:, :H, :I // 32] = rand_u8((E, H, I // 32), 117, 124, g)
    t["w2_bias"][:, :H] = torch.randn(E, H, device=DEV, generator=g).to(torch.bfloat16)
    return t


def rup(x, m):
    return (x + m - 1) // m * m


def artifact_layer(kind, E, H, Hp, Ip, g):
    """A moepack artifact's layer as loaded (docs/triton_mxfp4.md, docs/gpt-oss.md "Marlin"):
    the shapes and dtypes moepack writes; the bytes are random (wrapping never reads them)."""
    if kind == "triton":
        kbp = lambda c: rup(c // 2, 32)  # noqa: E731
        gp = lambda gr: rup(gr, 4)  # noqa: E731
        return {"w13_weight": rand_u8((E, 2 * Ip // 4, 4 * kbp(H)), 0, 256, g),
                "w2_weight": rand_u8((E, rup(H, 16) // 4, 4 * kbp(Ip)), 0, 256, g),
                "w13_weight_scale": rand_u8((E, rup(2 * Ip, 256) // 32, 32 * gp(H // 32)), 117, 124, g),
                "w2_weight_scale": rand_u8((E, rup(H, 256) // 32, 32 * gp(Ip // 32)), 117, 124, g),
                "w13_bias": torch.randn(E, 2 * Ip, device=DEV, generator=g),
                "w2_bias": torch.randn(E, H, device=DEV, generator=g)}
    i32 = lambda *s: rand_u8((*s[:-1], s[-1] * 4), 0, 256, g).view(torch.int32)  # noqa: E731
    return {"w13_weight": i32(E, Hp // 16, 2 * Ip * 2),
            "w2_weight": i32(E, Ip // 16, Hp * 2),
            "w13_weight_scale": rand_u8((E, Hp // 32, 2 * Ip), 117, 124, g).view(torch.float8_e8m0fnu),
            "w2_weight_scale": rand_u8((E, Ip // 32, Hp), 117, 124, g).view(torch.float8_e8m0fnu),
            "w13_bias": torch.randn(E, 2 * Ip, device=DEV, generator=g).to(torch.bfloat16),
            "w2_bias": torch.randn(E, Hp, device=DEV, generator=g).to(torch.bfloat16)}


def plugin_wrapper():
    """The plugin's wrap_triton_mxfp4 (loaded from its file: the module imports no vLLM), or None."""
    path = os.path.join(REPO, "integrations", "vllm", "moepack_vllm", "triton_mxfp4.py")
    if not os.path.exists(path):
        return None
    spec = importlib.util.spec_from_file_location("moepack_triton_mxfp4", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass resolves annotations through it
    spec.loader.exec_module(mod)
    return getattr(mod, "wrap_triton_mxfp4", None)


def wrap_here(t, H, Ip):
    """What the plugin does to a triton-mxfp4 layer, with the triton_kernels API vLLM 0.33
    vendors: each buffer's transpose as the storage of a Tensor in the Hopper layouts (no copy),
    the scales in PrecisionConfigs, split_k constrained to 1 as vLLM's _swizzle_mxfp4 does."""
    import triton_kernels.matmul_ogs_details.opt_flags as opt_flags
    from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig
    from triton_kernels.numerics import InFlexData
    from triton_kernels.tensor import FP4, Storage, Tensor
    from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout

    def proj(w, s, k, n):
        E, groups = w.shape[0], rup(k // 32, 4)
        vl = HopperMXValueLayout([E, k // 2, n], mx_axis=1)
        sl = HopperMXScaleLayout([E, groups, n], mx_axis=1, num_warps=8)
        return (Tensor(Storage(w.mT, vl), dtype=FP4, shape=[E, k, n]),
                PrecisionConfig(weight_scale=Tensor(Storage(s.mT, sl), dtype=torch.uint8,
                                                    shape=[E, groups, n]),
                                flex_ctx=FlexCtx(rhs_data=InFlexData())))
    opt_flags.update_opt_flags_constraints({"split_k": 1})
    return (proj(t["w13_weight"], t["w13_weight_scale"], H, 2 * Ip),
            proj(t["w2_weight"], t["w2_weight_scale"], Ip, H))


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def mem():
    return torch.cuda.memory_allocated() if DEV == "cuda" else 0


def run_path(path, a, vns, mns, wrap):
    """Loads every layer, then post-processes them one by one; returns the record."""
    E, H, I = a.E, a.H, a.I
    backend = "MARLIN" if path == "vllm-marlin" or path == "plugin-marlin" else "TRITON"
    Hp, Ip = vns["mxfp4_round_up_hidden_size_and_intermediate_size"](
        vns["Mxfp4MoeBackend"][backend], H, I)
    g = torch.Generator(device=DEV).manual_seed(0)
    sync()
    base = mem()
    if path.startswith("vllm"):
        layers = [loaded_layer(E, H, I, Hp, Ip, g) for _ in range(a.layers)]
    else:
        layers = [artifact_layer(backend.lower(), E, H, Hp, Ip, g) for _ in range(a.layers)]
    sync()
    loaded = mem() - base
    if DEV == "cuda":
        torch.cuda.reset_peak_memory_stats()
    rec = {"path": path, "Hp": Hp, "Ip": Ip, "layers": [], "loaded_GiB": loaded / GiB}
    kept, layer = [], None
    for i in range(a.layers):
        t = layers[i]
        sync()
        before = mem()
        if DEV == "cuda":
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        if path == "vllm-triton" or path == "vllm-marlin":
            layer = torch.nn.Module()
            layer.params_dtype = torch.bfloat16
            for n in ("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"):
                layer.register_parameter(n, torch.nn.Parameter(t[n], requires_grad=False))
            out = vns["convert_gpt_oss_weight_to_mxfp4_moe_kernel_format"](
                mxfp4_backend=vns["Mxfp4MoeBackend"][backend], layer=layer,
                w13_weight=t["w13_weight"], w2_weight=t["w2_weight"],
                w13_weight_scale=t["w13_weight_scale"], w2_weight_scale=t["w2_weight_scale"],
                w13_bias=t["w13_bias"], w2_bias=t["w2_bias"]) if backend == "TRITON" else \
                mns["prepare_moe_mxfp4_layer_for_marlin"](
                    layer, t["w13_weight"], t["w2_weight"], t["w13_weight_scale"],
                    t["w2_weight_scale"], t["w13_bias"], t["w2_bias"])
        elif path == "plugin-triton":
            out = (wrap(t["w13_weight"], t["w2_weight"], t["w13_weight_scale"],
                        t["w2_weight_scale"], hidden=H, inter_padded=Ip)
                   if a.plugin_wrap else wrap_here(t, H, Ip), t)
        else:  # plugin-marlin: the artifact's tensors are the layer's parameters as loaded
            layer = torch.nn.Module()
            for n, v in t.items():
                layer.register_parameter(n, torch.nn.Parameter(v, requires_grad=False))
            out = layer
        sync()
        dt = time.perf_counter() - t0
        peak = torch.cuda.max_memory_allocated() - before if DEV == "cuda" else 0
        # vLLM frees the loaded parameters (replace_parameter / del); the plugin keeps them.
        layers[i] = None
        del t
        layer = None
        kept.append(out)
        sync()
        rec["layers"].append({"layer": i, "seconds": dt, "transient_GiB": peak / GiB,
                              "held_after_GiB": (mem() - base) / GiB})
        print(f"{path:14s} layer {i:2d}: {dt * 1e3:9.2f} ms  transient {peak / GiB:7.3f} GiB  "
              f"held {(mem() - base) / GiB:7.2f} GiB", flush=True)
    secs = [r["seconds"] for r in rec["layers"]]
    rec.update(total_seconds=sum(secs), first_layer_seconds=secs[0],
               max_transient_GiB=max(r["transient_GiB"] for r in rec["layers"]),
               held_after_GiB=(mem() - base) / GiB)
    print(f"{path:14s} TOTAL {a.layers} layers: {rec['total_seconds']:.3f} s (first layer "
          f"{secs[0]:.3f} s), max transient {rec['max_transient_GiB']:.3f} GiB above the loaded "
          f"model ({loaded / GiB:.2f} GiB loaded, Hp {Hp} Ip {Ip}), held after "
          f"{rec['held_after_GiB']:.2f} GiB", flush=True)
    del kept, layers
    return rec


def main():
    global DEV
    ap = argparse.ArgumentParser()
    ap.add_argument("--carry", required=True)
    ap.add_argument("--so", help="the wheel's _C_stable_libtorch.abi3.so (gptq_marlin_repack)")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--E", type=int, default=128)
    ap.add_argument("--H", type=int, default=2880)
    ap.add_argument("--I", type=int, default=2880)
    ap.add_argument("--paths", default="vllm-triton,vllm-marlin,plugin-triton,plugin-marlin")
    ap.add_argument("--json")
    ap.add_argument("--cpu-selftest", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, a.carry)
    repack = None
    if a.cpu_selftest:
        DEV = gtm.DEV = "cpu"
        import triton_kernels.target_info as ti
        import triton_kernels.tensor_details.layout as layout
        ti.cuda_capability_geq = layout.cuda_capability_geq = lambda M, m=0: (9, 0) >= (M, m)
        layout.is_hip_cdna4 = lambda: False
        torch.cuda.get_device_capability = lambda *x: (9, 0)
        repack = selftest_repack
    elif a.so:
        torch.ops.load_library(a.so)
    paths = a.paths.split(",")
    if "vllm-marlin" in paths and not (a.so or a.cpu_selftest):
        raise SystemExit("vllm-marlin needs --so (the wheel's _C_stable_libtorch.abi3.so)")
    vns = gtm.load_vllm(a.carry)
    mns = load_vllm_marlin(a.carry, repack) if "vllm-marlin" in paths else None
    wrap = plugin_wrapper()
    a.plugin_wrap = wrap is not None
    result = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu selftest",
              "torch": torch.__version__, "shape": {"layers": a.layers, "E": a.E, "H": a.H,
                                                    "I": a.I},
              "plugin_triton_wrap": "moepack_vllm/triton_mxfp4.py wrap_triton_mxfp4"
              if a.plugin_wrap else "triton_kernels calls in this script (plugin has none yet)",
              "paths": {}}
    print(f"device {result['device']}, torch {torch.__version__}, {a.layers} layers x {a.E} "
          f"experts, H {a.H} I {a.I}; plugin-triton: {result['plugin_triton_wrap']}", flush=True)
    failed = False
    for p in paths:
        try:
            result["paths"][p] = run_path(p, a, vns, mns, wrap)
        except Exception as e:  # one path's failure (e.g. out of memory) keeps the others
            traceback.print_exc()
            result["paths"][p] = {"error": f"{type(e).__name__}: {e}"}
            failed = True
        if DEV == "cuda":
            torch.cuda.empty_cache()
    print("\n| path | model s | first layer s | mean layer ms | max transient GiB | loaded GiB "
          "| held after GiB |\n|---|---|---|---|---|---|---|")
    for p, r in result["paths"].items():
        if "error" in r:
            print(f"| {p} | {r['error'][:80]} | | | | | |")
            continue
        print(f"| {p} | {r['total_seconds']:.3f} | {r['first_layer_seconds']:.3f} | "
              f"{1e3 * r['total_seconds'] / a.layers:.2f} | {r['max_transient_GiB']:.3f} | "
              f"{r['loaded_GiB']:.2f} | {r['held_after_GiB']:.2f} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

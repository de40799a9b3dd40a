#!/usr/bin/env python3
"""Issue 23 item 7 on the H100: Humming post-processing of a WHOLE Qwen3-30B-A3B-shaped model
(48 MoE layers, E 128, top-8, H 2048, I 768, GPTQ int4 g128, bf16), stock vLLM 0.33 vs the
moepack plugin, measured (not derived from one layer).

Both paths start from host memory (the disk read is the same size in both and is left out):
  stock  = what vLLM 0.33 does at load for AutoGPTQMoEMethod on sm90: the checkpoint-format
           stacked GPTQ tensors of every layer are copied to the GPU (load_weights), then
           process_weights_after_loading runs layer by layer: per sublayer (w13, w2)
           GPTQWeightSchema.convert_humming + prepare_and_transform_humming_tensors (N padded to
           256, K to 128), the outputs replacing the layer's parameters (the checkpoint-format
           ones are freed as each layer finishes, as _replace_layer_parameters does);
  plugin = moepack's already-processed w13/w2 tensors (the artifact of `moepack convert
           --target-arch sm90`) copied to the GPU for every layer, plus the plugin's per-layer
           work (LayerConfig from the recorded string); no transform.
Memory: torch.cuda.max_memory_allocated above the allocation before the path starts (nothing of
the model resident), the resident bytes after, and the transient = peak - max(resident before
the transform, resident after). Tuning tables (get_heuristics_config, lru-cached per LayerConfig
in a process, so once per distinct shape) are timed separately: both paths pay them unless the
plugin seeds them from the artifact.
All 48 layers use the same source layer's bytes (one synth layer; the per-layer cost does not
depend on the values). Layer 0 of the stock output is checked byte-equal to moepack's tensors.

  python3 whole_model.py --src SRC --dst DST --out DIR [--layers 48]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

GIB = 2**30


def log(msg, fh):
    print(msg, flush=True)
    fh.write(msg + "\n")
    fh.flush()


def nbytes(d):
    return sum(v.numel() * v.element_size() for v in d.values())


def source_host(src: Path, E: int) -> dict:
    """vLLM's stacked GPTQ parameters of layer 0 (K-first, scales bf16), on the host."""
    t = {}
    for f in sorted(src.glob("*.safetensors")):
        t.update(load_file(str(f)))
    p = "model.layers.0.mlp.experts."

    def stack(proj, what):
        return torch.stack([t[f"{p}{e}.{proj}.{what}"] for e in range(E)])

    cat = lambda what: torch.cat([stack("gate_proj", what), stack("up_proj", what)], -1)  # noqa
    return {"w13": {"qweight": cat("qweight"), "scales": cat("scales").to(torch.bfloat16),
                    "qzeros": cat("qzeros")},
            "w2": {"qweight": stack("down_proj", "qweight"),
                   "scales": stack("down_proj", "scales").to(torch.bfloat16),
                   "qzeros": stack("down_proj", "qzeros")}}


def artifact_host(dst: Path):
    m = json.loads((dst / "moepack.json").read_text())
    L = m["layers"][0]
    t = {}
    for f in sorted(dst.glob("*.safetensors")):
        t.update(load_file(str(f)))
    tensors = {sub: {"weight": t[L["param_prefix"] + f"{sub}_weight"],
                     "weight_scale": t[L["param_prefix"] + f"{sub}_weight_scale"]}
               for sub in ("w13", "w2")}
    strings = {sub: L["layout_config"][f"{sub}_layer_config"] for sub in ("w13", "w2")}
    return m, L, tensors, strings


def to_gpu(d):
    return {k: v.to("cuda") for k, v in d.items()}


def transform(sub, t, E, H, I, G):  # noqa: E741
    """vLLM 0.33 _process_single_sublayer for a GPTQ int4 sublayer (no requant)."""
    from humming.schema import BaseWeightSchema, HummingInputSchema
    from humming.transform import prepare_and_transform_humming_tensors

    n, k, stacks = {"w13": (2 * I, H, [I, I]), "w2": (H, I, [H])}[sub]
    schema = BaseWeightSchema.from_config({"quant_method": "gptq", "bits": 4, "group_size": G,
                                           "desc_act": False, "sym": True})
    ws, conv = schema.convert_humming(tensors=t, shape_n_stacks=stacks, shape_k_stacks=[k],
                                      param_dtype=torch.bfloat16, num_experts=E)
    ins = HummingInputSchema()
    assert ins.is_compatible_with(ws, torch.bfloat16)
    cfg, out = prepare_and_transform_humming_tensors(
        tensors=conv, shape_n=n, shape_k=k, pad_n_to_multiple=256, pad_k_to_multiple=128,
        input_schema=ins, weight_schema=ws, has_bias=False, num_experts=E,
        torch_dtype=torch.bfloat16, device=torch.device("cuda"))
    return cfg, out


def start():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def stock(host, shape, layers, plug_host, plug_strings, fh):
    E, H, I, G = shape  # noqa: E741
    base = start()
    t0 = time.perf_counter()
    model = [{sub: to_gpu(host[sub]) for sub in ("w13", "w2")} for _ in range(layers)]
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    raw = torch.cuda.memory_allocated() - base
    per_layer, same0 = [], None
    t1 = time.perf_counter()
    for i in range(layers):
        tl = time.perf_counter()
        done = {}
        for sub in ("w13", "w2"):
            cfg, out = transform(sub, model[i][sub], E, H, I, G)
            done[sub] = (cfg, out)
        model[i] = done  # the checkpoint-format tensors of this layer are freed here
        torch.cuda.synchronize()
        per_layer.append(time.perf_counter() - tl)
        if i == 0:
            same0 = {f"{sub}_{k}": bool(torch.equal(done[sub][1][k].cpu().view(torch.uint8),
                                                    plug_host[sub][k].view(torch.uint8)))
                     for sub in ("w13", "w2") for k in ("weight", "weight_scale")}
            same0.update({f"{sub}_layer_config": done[sub][0].to_str() == plug_strings[sub]
                          for sub in ("w13", "w2")})
            t1 += time.perf_counter() - tl - per_layer[0]  # the check is not post-processing
    torch.cuda.synchronize()
    proc_s = time.perf_counter() - t1
    peak = torch.cuda.max_memory_allocated() - base
    after = torch.cuda.memory_allocated() - base
    cfgs = {sub: model[0][sub][0] for sub in ("w13", "w2")}
    r = {"load_to_gpu_seconds": load_s, "postprocess_seconds": proc_s,
         "postprocess_first_layer_seconds": per_layer[0],
         "postprocess_other_layers_mean_seconds": sum(per_layer[1:]) / max(1, layers - 1),
         "resident_before_bytes": raw, "resident_after_bytes": after, "peak_bytes": peak,
         "transient_bytes": peak - max(raw, after), "layer0_equal_to_moepack": same0}
    del model
    log(f"stock  ({layers} layers): load to GPU {load_s:.2f} s, post-processing {proc_s:.2f} s "
        f"(first layer {per_layer[0] * 1e3:.0f} ms incl. humming's JIT if cold, others mean "
        f"{r['postprocess_other_layers_mean_seconds'] * 1e3:.1f} ms), resident checkpoint-format "
        f"{raw / GIB:.2f} GiB -> processed {after / GIB:.2f} GiB, peak {peak / GIB:.2f} GiB, "
        f"transient {r['transient_bytes'] / GIB:.3f} GiB", fh)
    log(f"  stock layer 0 == moepack's artifact: {same0}", fh)
    return r, cfgs


def plugin(plug_host, strings, layers, fh):
    from humming.config import LayerConfig

    base = start()
    t0 = time.perf_counter()
    model = []
    for _ in range(layers):
        layer = {sub: to_gpu(plug_host[sub]) for sub in ("w13", "w2")}
        cfgs = {sub: LayerConfig(**json.loads(strings[sub])) for sub in ("w13", "w2")}
        model.append((layer, cfgs))
    torch.cuda.synchronize()
    load_s = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() - base
    after = torch.cuda.memory_allocated() - base
    r = {"load_to_gpu_seconds": load_s, "postprocess_seconds": 0.0, "resident_after_bytes": after,
         "peak_bytes": peak, "transient_bytes": peak - after}
    del model
    log(f"plugin ({layers} layers): load to GPU {load_s:.2f} s (incl. LayerConfig from the "
        f"manifest), no post-processing, resident {after / GIB:.2f} GiB, peak {peak / GIB:.2f} "
        f"GiB, transient {r['transient_bytes'] / GIB:.3f} GiB", fh)
    return r


def tuning(cfgs, fh):
    import humming.tune as ht
    from humming.config import GemmType

    out = {}
    for sub in ("w13", "w2"):
        ht._get_heuristics_config.cache_clear()
        t0 = time.perf_counter()
        ht.get_heuristics_config(layer_config=cfgs[sub], use_f16_accum=False,
                                 use_batch_invariant=False, gemm_type=GemmType.INDEXED)
        out[sub] = time.perf_counter() - t0
    log(f"tuning tables (get_heuristics_config, once per distinct LayerConfig per process): "
        f"{out}", fh)
    return out


DEVICE_FIELDS = ("name", "is_ppu", "sm_count", "sm_major", "sm_minor", "sm_version",
                 "max_threads_per_block", "max_threads_per_sm", "max_registers_per_sm",
                 "l2_cache_size", "l1_cache_size", "default_smem_size", "max_smem_size",
                 "memory_clock_khz", "memory_bus_width", "sm_clock_khz", "memory_bandwidth_gbps",
                 "tensorcore_tops")


def dump_tables(cfgs, seeded: Path, out: Path, fh):
    """The H100's own tables + DeviceInfo (to build an exact CPU DeviceInfo), and equality with
    the tables `moepack-vllm seed-tuning` computed on a CPU (carried), field by field."""
    import humming.tune as ht
    from humming.config import GemmType
    from humming.device import DeviceInfo

    info = DeviceInfo(0)
    dev = {}
    for f in DEVICE_FIELDS:
        try:
            dev[f] = getattr(info, f)
        except Exception as ex:  # noqa: BLE001 - record what the extension lacks
            dev[f] = f"unavailable: {ex}"
    tabs = {sub: {"layer_config": cfgs[sub].to_str(),
                  "tuning": json.loads(json.dumps(ht.get_heuristics_config(
                      layer_config=cfgs[sub], use_f16_accum=False, use_batch_invariant=False,
                      gemm_type=GemmType.INDEXED)))} for sub in ("w13", "w2")}
    (out / "tuning_h100.json").write_text(json.dumps({"device": dev, **tabs}, indent=1))
    log(f"device info: {dev}", fh)
    res = {}
    if seeded.exists():
        s = json.loads(seeded.read_text())
        for sub in ("w13", "w2"):
            mine = s.get("tables", s).get(sub, {})
            same_cfg = mine.get("layer_config") == tabs[sub]["layer_config"]
            res[f"{sub}_seeded_equal"] = same_cfg and mine.get("tuning") == tabs[sub]["tuning"]
            res[f"{sub}_seeded_for_this_config"] = same_cfg
            if not res[f"{sub}_seeded_equal"] and same_cfg:
                a, b = mine.get("tuning", []), tabs[sub]["tuning"]
                diff = [i for i in range(max(len(a), len(b)))
                        if i >= len(a) or i >= len(b) or a[i] != b[i]]
                res[f"{sub}_first_differences"] = [
                    {"i": i, "cpu": a[i] if i < len(a) else None,
                     "h100": b[i] if i < len(b) else None} for i in diff[:3]]
    log(f"CPU-seeded tables vs the H100's: {res}", fh)
    res["recomputed_with_fake_device"] = fake_device_tables(cfgs, dev, tabs, out, fh)
    return res


def fake_device_tables(cfgs, dev, tabs, out: Path, fh):
    """The same tables computed here with humming's DeviceInfo replaced by (a) a plain copy of
    this device's fields (does a recorded fingerprint reproduce the H100's tables?) and (b)
    humming_emu's fake H100 (what the CPU tables used): which one equals the H100's own."""
    import types

    import humming.device as hdev
    import humming.tune as ht
    from humming.config import GemmType

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import humming_emu

    fakes = {"copy_of_this_device": types.SimpleNamespace(index=0, **dev),
             "humming_emu_fake_h100": humming_emu._FakeDeviceValue(90)}
    saved = hdev.DeviceInfo._get_value
    res, dumps = {}, {}
    try:
        for name, fake in fakes.items():
            hdev.DeviceInfo._get_value = lambda self, fake=fake: fake
            for sub in ("w13", "w2"):
                ht._get_heuristics_config.cache_clear()
                try:
                    got = json.loads(json.dumps(ht._get_heuristics_config(
                        cfgs[sub], None, False, False, False, GemmType.INDEXED, 0, False)))
                    res[f"{name}_{sub}_equal_h100"] = got == tabs[sub]["tuning"]
                    dumps[f"{name}_{sub}"] = got
                except Exception as ex:  # noqa: BLE001
                    res[f"{name}_{sub}_equal_h100"] = f"raised {type(ex).__name__}: {ex}"
    finally:
        hdev.DeviceInfo._get_value = saved
        ht._get_heuristics_config.cache_clear()
    (out / "tuning_fake_devices.json").write_text(json.dumps(dumps, indent=1))
    log(f"tables with a fake DeviceInfo on this machine: {res}", fh)
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", required=True, type=Path)
    ap.add_argument("--dst", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--seeded", type=Path,
                    default=Path(__file__).resolve().parent / "tuning_cpu_fake_h100.json")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    fh = open(args.out / "whole_model.txt", "w")
    import humming

    log(f"device {torch.cuda.get_device_name(0)}, humming-kernels {humming.__version__}, "
        f"torch {torch.__version__}", fh)
    m, L, plug_host, strings = artifact_host(args.dst)
    shape = (L["experts"], L["hidden"], L["inter"], m["target_quant_params"]["group_size"])
    log(f"shape E {shape[0]} H {shape[1]} I {shape[2]} g {shape[3]}, backend {m['backend']}, "
        f"{args.layers} layers", fh)
    host = source_host(args.src, shape[0])
    res = {"device": torch.cuda.get_device_name(0), "layers": args.layers,
           "shape": dict(zip("EHIG", shape))}
    # humming's JIT is warm for the measured runs as on a second vLLM start (its disk cache);
    # the cold first layer of a fresh cache is reported by a separate pass first.
    res["stock_cold_jit"], _ = stock(host, shape, 1, plug_host, strings, fh)
    res["stock"], cfgs = stock(host, shape, args.layers, plug_host, strings, fh)
    res["plugin"] = plugin(plug_host, strings, args.layers, fh)
    res["tuning_seconds"] = tuning(cfgs, fh)
    res["seeded_tables"] = dump_tables(cfgs, args.seeded, args.out, fh)
    (args.out / "whole_model.json").write_text(json.dumps(res, indent=1))
    ok = all(res["stock"]["layer0_equal_to_moepack"].values())
    log(f"SUMMARY whole model: {'PASS' if ok else 'FAIL (layer 0 bytes differ)'}", fh)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

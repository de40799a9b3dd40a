#!/usr/bin/env python3
"""moepack's Humming conversion against humming-kernels 0.1.19's own transform on random shapes
(issue 23: shapes no fixture has). For each trial: `moepack synth` a one-layer checkpoint
(GPTQ int4/int8, AWQ, compressed-tensors int4/int8; random E, H, I, group 32/64/128), `moepack
convert` it with the defaults (sm90, vLLM 0.33 -> `humming`), stack the source into the layer
parameters vLLM's WNA16 method holds, run vLLM's Humming post-processing (make_fixtures.py's
mirror glue: humming's own schema, padding and transform code) with humming's three CUDA weight
kernels emulated on the CPU (humming_emu.py; equal to the real kernels on the H100, 23/23), and
compare every tensor byte for byte and both LayerConfig strings.

  python check_random_shapes.py MOEPACK_BIN SEED TRIALS WORKDIR    (in the vLLM 0.33 venv)
Prints one line per trial and "ok N bad M skipped K"; exit 1 if any is bad.
"""
import glob
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import humming_emu  # noqa: E402

humming_emu.install()
import make_fixtures as mf  # noqa: E402


def load_dir(d: str) -> dict:
    out = {}
    for f in glob.glob(d + "/*.safetensors"):
        out.update(load_file(f))
    return out


def layer_inputs(src: dict, fmt: str, experts: list, H: int, I: int, g: int, act: str,  # noqa: E741
                 narrow=None, desc: str = ""):
    """The layer parameters vLLM's WNA16 method holds for experts `experts` (global ids, in this
    order) of layer 0 of a `moepack synth` checkpoint, before its Humming post-processing, and
    make_fixtures' Case for them. `narrow(proj, name, t)` (None: identity) is the loader's
    narrowing of one expert's tensor for a rank; I is then the rank's intermediate size."""
    dt = mf.TORCH_DTYPE[act]
    p = "model.layers.0.mlp.experts."
    cut = narrow or (lambda proj, name, t: t)
    st = lambda proj, w: torch.stack([cut(proj, w, src[f"{p}{e}.{proj}.{w}"]) for e in experts])
    bits = 8 if fmt in ("gptq8", "ct-w8a16") else 4
    E = len(experts)
    inputs = {}
    if fmt in ("gptq", "gptq8", "awq"):
        for w in ("qweight", "scales", "qzeros"):
            inputs[f"w13_{w}"] = torch.cat([st("gate_proj", w), st("up_proj", w)], -1)
            inputs[f"w2_{w}"] = st("down_proj", w)
        for s in ("w13", "w2"):
            inputs[f"{s}_scales"] = inputs[f"{s}_scales"].to(dt)  # the loader's copy
        case = mf.Case(desc, "awq" if fmt == "awq" else "gptq", bits, g, E, H, I,
                       sym=fmt != "awq", dtype=act)
    else:
        names = [n.split(".")[-1] for n in src if n.startswith(p + "0.gate_proj.")]
        for w in names:
            if w == "weight_shape":
                continue
            inputs[f"w13_{w}"] = torch.cat([st("gate_proj", w), st("up_proj", w)], 1)
            inputs[f"w2_{w}"] = st("down_proj", w)
        sym = "w13_weight_zero_point" not in inputs
        inputs["w13_weight_shape"] = torch.tensor([[2 * I, H]] * E, dtype=torch.float32)
        inputs["w2_weight_shape"] = torch.tensor([[H, I]] * E, dtype=torch.float32)
        for s_ in ("w13", "w2"):
            inputs[f"{s_}_weight_scale"] = inputs[f"{s_}_weight_scale"].to(dt)
        case = mf.Case(desc, "ct", bits, g, E, H, I, sym=sym, dtype=act)
    return inputs, case


def compare_layer(out: dict, info: dict, dst: dict, prefix: str, params: list,
                  layout_config: dict) -> list:
    """Every tensor humming's transform left (`out`) against moepack's (`dst`, names under
    `prefix`), the parameter count, and both LayerConfig strings: the differences."""
    errs = []
    for k, v in out.items():
        mine = dst.get(prefix + k)
        if mine is None:
            errs.append(f"{k} missing"); continue
        if mine.dtype != v.dtype or mine.shape != v.shape or not torch.equal(mine.view(torch.uint8) if mine.dtype != torch.int32 else mine, v.view(torch.uint8) if v.dtype != torch.int32 else v):
            errs.append(f"{k} differs {tuple(mine.shape)} {tuple(v.shape)}")
    if len(params) != len(out):
        errs.append(f"param count {len(params)} vs {len(out)}")
    for s in ("w13", "w2"):
        if layout_config[f"{s}_layer_config"] != info[s]["layer_config"]:
            errs.append(f"{s} LayerConfig differs:\n  {layout_config[s + '_layer_config']}\n  {info[s]['layer_config']}")
    return errs


def main() -> int:
    B = sys.argv[1]
    rnd = random.Random(int(sys.argv[2]))
    trials = int(sys.argv[3])
    work = sys.argv[4]
    ok = bad = skipped = 0
    for t in range(trials):
        fmt = rnd.choice(["gptq", "gptq8", "awq", "ct-w4a16", "ct-w8a16"])
        g = rnd.choice([32, 64, 128])
        E = rnd.randint(1, 5)
        if fmt in ("gptq", "gptq8", "awq"):
            H = 128 * rnd.randint(1, 4)
        else:
            H = g * rnd.randint(max(1, 64 // g), 640 // g)
        I = g * rnd.randint(max(1, 64 // g), 512 // g)  # noqa: E741
        act = rnd.choice(["bf16", "fp16"])
        synth_fmt = {"gptq8": "gptq"}.get(fmt, fmt)
        extra = ["--bits", "8"] if fmt == "gptq8" else []
        d = f"{work}/{t}"
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([B, "synth", d + "/src", "--format", synth_fmt, "--layers", "1", "--experts", str(E),
                        "--hidden", str(H), "--inter", str(I), "--group-size", str(g), "--seed", str(t), "--top-k", str(min(2, E))] + extra,
                       check=True, stdout=subprocess.DEVNULL)
        r = subprocess.run([B, "convert", d + "/src", d + "/dst", "--act-dtype", act], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        desc = f"{fmt} g{g} E{E} H{H} I{I} {act}"
        if r.returncode != 0:
            print("convert refused", desc, r.stderr.strip()[:200]); skipped += 1; continue
        m = json.load(open(d + "/dst/moepack.json"))
        if m["backend"] != "humming":
            print("not humming:", desc, m["backend"]); skipped += 1; continue
        inputs, case = layer_inputs(load_dir(d + "/src"), fmt, list(range(E)), H, I, g, act,
                                    desc=desc)
        out, info = mf.run_mirror_glue(case, inputs, "cpu")
        L = m["layers"][0]
        errs = compare_layer(out, info, load_dir(d + "/dst"), L["param_prefix"], L["params"],
                             L["layout_config"])
        if errs:
            bad += 1; print("MISMATCH", desc, errs)
        else:
            ok += 1; print("ok", desc, L.get("layout_decisions"))
    print(f"ok {ok} bad {bad} skipped {skipped}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

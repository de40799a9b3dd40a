#!/usr/bin/env python3
"""moepack's Humming layout per tensor- or expert-parallel rank against humming-kernels 0.1.19's
own transform of that rank's slice (issue 25): what each rank of vLLM 0.33 holds after its loader
narrowed the checkpoint and its Humming post-processing ran on the slice alone.

For each trial: `moepack synth` a one-layer checkpoint (GPTQ int4/int8, AWQ, compressed-tensors
int4/int8; random E, H, group), with I = tp * (a multiple of the group); for symmetric formats,
half the trials rewrite the source's codes so that no code is 0 except one in the w13 rows of one
rank and one in the w2 columns of another (the Humming recode, a decision made per rank over its
own slice, then differs between ranks, and the whole layer would not recode at all). Then
`moepack convert --tensor-parallel-size N` (or `--expert-parallel N`, linear or round_robin) with
the defaults (sm90, vLLM 0.33 -> `humming`) gives every rank's tensors by moepack's real split
path. Independently of moepack's C++, per rank: the source's per-expert tensors narrowed here as
vLLM 0.33's RoutedExperts loader narrows them for tp_rank r (gate and up rows [r I/N, (r+1) I/N)
each, w2's K columns and their groups; packed words and zero points cut along their packing), or
the rank's experts by determine_expert_map's placement, stacked into the layer parameters vLLM's
WNA16 method holds (check_random_shapes.layer_inputs), then vLLM's Humming post-processing
(make_fixtures' mirror glue: humming's own schema, recode decision, padding and transform) with
humming's three CUDA weight kernels emulated on the CPU (humming_emu.py). Every tensor of the rank
must equal it byte for byte, and the rank's recorded LayerConfig strings (moepack.json
layers[0].ranks[r].layout_config) humming's own.

  python check_parallel_shapes.py MOEPACK_BIN SEED TRIALS WORKDIR    (in the vLLM 0.33 venv)
Prints one line per trial and "ok N bad M skipped K split S" (S: trials whose ranks made different
recode decisions); exit 1 if any is bad.
"""
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

import check_random_shapes as crs  # noqa: E402  (installs the kernel emulation)
import make_fixtures as mf  # noqa: E402

# Per source tensor of one expert: (axis, stored elements per logical element... as a divisor)
# along N (the Linear's output rows) and along K (its inputs). pk = codes per int32 word.
#   GPTQ qweight [K/pk, N], scales [G, N], qzeros [G, N/pk]
#   AWQ  qweight [K, N/8],  scales [G, N], qzeros [G, N/8]
#   CT   weight_packed [N, K/pk], weight_scale [N, G], weight_zero_point [N/pk, G]
def axes(fmt: str, name: str, pk: int, g: int):
    if fmt in ("gptq", "gptq8"):
        return {"qweight": ((1, 1), (0, pk)), "scales": ((1, 1), (0, g)),
                "qzeros": ((1, pk), (0, g))}[name]
    if fmt == "awq":
        return {"qweight": ((1, 8), (0, 1)), "scales": ((1, 1), (0, g)),
                "qzeros": ((1, 8), (0, g))}[name]
    return {"weight_packed": ((0, 1), (1, pk)), "weight_scale": ((0, 1), (1, g)),
            "weight_zero_point": ((0, pk), (1, g))}[name]


def tp_narrow(fmt: str, bits: int, g: int, ip: int, r: int):
    """vLLM 0.33's RoutedExperts._load_w13 / _load_w2 for tp_rank r: gate and up narrowed along N,
    down along K, by I / tp = ip (in each tensor's stored units)."""
    pk = 32 // bits

    def narrow(proj, name, t):
        n_axis, k_axis = axes(fmt, name, pk, g)
        axis, div = n_axis if proj in ("gate_proj", "up_proj") else k_axis
        return t.narrow(axis, r * ip // div, ip // div)
    return narrow


def ep_experts(E: int, ep: int, r: int, placement: str) -> list:
    """determine_expert_map's experts of rank r, in local order."""
    if placement == "round_robin":
        return list(range(r, E, ep))
    base, rem = divmod(E, ep)
    start = r * base + min(r, rem)
    return list(range(start, start + base + (1 if r < rem else 0)))


def _int32(x):
    x = x & 0xFFFFFFFF
    return torch.where(x >= (1 << 31), x - (1 << 32), x).to(torch.int32)


def no_zero(t: torch.Tensor, bits: int) -> torch.Tensor:
    """Every b-bit code 0 of the packed int32 words becomes 1."""
    u, mask = t.to(torch.int64) & 0xFFFFFFFF, (1 << bits) - 1
    for i in range(32 // bits):
        u = torch.where(((u >> (i * bits)) & mask) == 0, u | (1 << (i * bits)), u)
    return _int32(u)


def zero_at(t: torch.Tensor, bits: int, index: tuple) -> torch.Tensor:
    """Code 0 in the lowest field of word `index`."""
    t = t.clone()
    t[index] = _int32(torch.tensor(int(t[index]) & ~((1 << bits) - 1)))
    return t


def craft_zeros(src_dir: str, fmt: str, bits: int, E: int, I: int, par: dict) -> dict:
    """Rewrites the source so that no code is 0 but one in rank zr's w13 and one in rank zr2's
    w2 (zr != zr2 where there are two ranks); returns the decision each rank must make."""
    ranks = par["size"]
    zr, zr2 = 0, 1 % ranks
    pk, codes = 32 // bits, "qweight" if fmt in ("gptq", "gptq8") else "weight_packed"
    if par["kind"] == "tp":
        ip = I // ranks
        e13 = e2 = 0
        n13, k2 = zr * ip, zr2 * ip  # the rank's first gate row, its first w2 column
    else:
        e13 = ep_experts(E, ranks, zr, par["placement"])[0]
        e2 = ep_experts(E, ranks, zr2, par["placement"])[0]
        n13 = k2 = 0
    p = "model.layers.0.mlp.experts."
    for f in Path(src_dir).glob("*.safetensors"):
        ts = load_file(str(f))
        for name in list(ts):
            if not name.startswith(p) or not name.endswith("." + codes):
                continue
            t = no_zero(ts[name], bits)
            e, proj = int(name[len(p):].split(".")[0]), name.split(".")[-2]
            gptq = codes == "qweight"
            if proj == "gate_proj" and e == e13:
                t = zero_at(t, bits, (0, n13) if gptq else (n13, 0))
            if proj == "down_proj" and e == e2:
                t = zero_at(t, bits, (k2 // pk, 0) if gptq else (0, k2 // pk))
            ts[name] = t
        save_file(ts, str(f), metadata={"format": "pt"})
    flt, uint = f"float{bits}e0m{bits - 1}", f"uint{bits}"
    return {r: {"w13_b_dtype": uint if r == zr else flt, "w2_b_dtype": uint if r == zr2 else flt}
            for r in range(ranks)}


def random_trial(rnd: random.Random):
    fmt = rnd.choice(["gptq", "gptq8", "awq", "ct-w4a16", "ct-w8a16"])
    g = rnd.choice([32, 64, 128])
    if rnd.random() < 0.5:
        par = {"kind": "tp", "size": rnd.choice([2, 4]), "placement": ""}
        E = rnd.randint(1, 4)
    else:
        par = {"kind": "ep", "size": rnd.choice([2, 3]),
               "placement": rnd.choice(["linear", "round_robin"])}
        E = rnd.randint(par["size"], 6)
    H = 128 * rnd.randint(1, 3) if fmt in ("gptq", "gptq8", "awq") else \
        g * rnd.randint(max(1, 64 // g), 512 // g)
    per_rank = g * rnd.randint(max(1, 64 // g), 256 // g)
    I = per_rank * (par["size"] if par["kind"] == "tp" else 1)  # noqa: E741
    return fmt, g, E, H, I, rnd.choice(["bf16", "fp16"]), par


def main() -> int:
    B, rnd, trials, work = sys.argv[1], random.Random(int(sys.argv[2])), int(sys.argv[3]), \
        sys.argv[4]
    ok = bad = skipped = split = 0
    for t in range(trials):
        fmt, g, E, H, I, act, par = random_trial(rnd)  # noqa: E741
        bits = 8 if fmt in ("gptq8", "ct-w8a16") else 4
        d = f"{work}/{t}"
        shutil.rmtree(d, ignore_errors=True)
        subprocess.run([B, "synth", d + "/src", "--format", {"gptq8": "gptq"}.get(fmt, fmt),
                        "--layers", "1", "--experts", str(E), "--hidden", str(H), "--inter",
                        str(I), "--group-size", str(g), "--seed", str(t), "--top-k",
                        str(min(2, E))] + (["--bits", "8"] if fmt == "gptq8" else []),
                       check=True, stdout=subprocess.DEVNULL)
        want = None
        if fmt != "awq" and rnd.random() < 0.5:
            want = craft_zeros(d + "/src", fmt, bits, E, I, par)
        flags = (["--tensor-parallel-size", str(par["size"])] if par["kind"] == "tp" else
                 ["--expert-parallel", str(par["size"]), "--expert-placement", par["placement"]])
        r = subprocess.run([B, "convert", d + "/src", d + "/dst", "--act-dtype", act,
                            "--vllm-target", "0.33"] + flags,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        desc = (f"{fmt} g{g} E{E} H{H} I{I} {act} {par['kind']}{par['size']} {par['placement']}"
                f"{' crafted' if want else ''}")
        if r.returncode != 0:
            print("convert refused", desc, r.stderr.strip()[:300]); skipped += 1; continue
        m = json.load(open(d + "/dst/moepack.json"))
        if m["backend"] != "humming":
            print("not humming:", desc, m["backend"]); skipped += 1; continue
        L, dst = m["layers"][0], crs.load_dir(d + "/dst")
        src = crs.load_dir(d + "/src")
        errs, decided = [], []
        for rank in range(par["size"]):
            tag = f"rank{rank:02d}-of-{par['size']:02d}/"
            if par["kind"] == "tp":
                ip = I // par["size"]
                inputs, case = crs.layer_inputs(src, fmt, list(range(E)), H, ip, g, act,
                                                tp_narrow(fmt, bits, g, ip, rank), desc)
            else:
                inputs, case = crs.layer_inputs(
                    src, fmt, ep_experts(E, par["size"], rank, par["placement"]), H, I, g, act,
                    desc=desc)
            out, info = mf.run_mirror_glue(case, inputs, "cpu")
            rec = L["ranks"][rank]
            params = [n for n in L["params"] if n.startswith(tag)]
            errs += [f"rank {rank}: {e}" for e in
                     crs.compare_layer(out, info, dst, tag + L["param_prefix"], params,
                                       rec["layout_config"])]
            decided.append(rec.get("layout_decisions", {}))
            if want and decided[-1] != want[rank]:
                errs.append(f"rank {rank}: decisions {decided[-1]}, expected {want[rank]}")
        if len({json.dumps(x, sort_keys=True) for x in decided}) > 1:
            split += 1
        if errs:
            bad += 1; print("MISMATCH", desc, errs)
        else:
            ok += 1; print("ok", desc, decided)
    print(f"ok {ok} bad {bad} skipped {skipped} split {split}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU proof for tensor- and expert-parallel artifacts (issue 25, item 3): each rank's tensors of
a `convert --tensor-parallel-size N` / `--expert-parallel N` artifact through vLLM 0.33.0's own
moe_wna16_marlin_gemm (the shipped MoE kernel binary), combined as vLLM combines the ranks:

  tensor parallel: every rank runs the whole MoE on the same tokens with its I/N slice (gemm1 over
                   its w13, silu(gate)*up, gemm2 over its w2 with the router weights, top-k sum);
                   the partial outputs are summed over ranks (what the all-reduce adds);
  expert parallel: every rank runs only the (token, k) slots routed to its experts, by the local
                   ids of vLLM's expert map (the other slots get weight 0); outputs summed.

Each against the fp32 reference of the unsharded source checkpoint (layouts.source_linear for
WNA16, bench/gpu_marlin_float.source_linear for FP8 block, MXFP8, NVFP4 and MXFP4), and the TP-1
artifact of the same source through the same kernel. The float Marlin layouts run through the
same kernel with their operands as bench/gpu_marlin_float.py builds them (NVFP4: each rank's own
processed global scales, divided by its own rescale factor 2^k). A case converted with
--vllm-w13-scale-size-k (vLLM's own loader permutation of the w13 scales, size_k = I/N) must fail
where group 128 and I/N <= 128 (the permutation the kernel does not read), next to the same case
converted by default, which must pass: both are printed.

  python gpu_parallel_kernel.py MOE_SO CASES_DIR [--json OUT.json]      (exit 0 when all hold)
CASES_DIR/<case>/{case.json, out/}; case.json: {"src" (the source directory, relative to the case;
default src/), "decode" (the source format: gptq, awq, or a float one), "bits" (WNA16),
"layout" (float Marlin only: marlin-fp8, marlin-mxfp8, marlin-nvfp4, marlin-mxfp4), "act"
(bf16 | fp16, default bf16), "expect": "pass"|"fail", "note"}. The fused MoE is
gpu_marlin_kernel.kernel_moe (shared with the whole-expert and float Marlin GPU runs).
Needs torch and a CUDA device only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from gpu_marlin_kernel import UINT4, UINT4B8, UINT8B128, kernel_moe, read_safetensors  # noqa: E402
from layouts import source_linear  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gpu_marlin_float as fm  # noqa: E402  (the float Marlin operands and source decoders)

RIGHT_TOL, WRONG_MIN = 2e-2, 0.1


NAMES = {"gptq": ("w13_qweight", "w13_scales", None, "w2_qweight", "w2_scales", None),
         "awq": ("w13_qweight", "w13_scales", "w13_qzeros", "w2_qweight", "w2_scales",
                 "w2_qzeros")}


def rank_params(out: Path, man: dict, layer: dict, rank: int | None, meta: dict):
    """The kernel's operands (gpu_marlin_kernel.kernel_moe's keyword form) from the rank's own
    files only (or the whole artifact's, rank None)."""
    if rank is None:
        files, key = [s["name"] for s in man["shards"]], ""
    else:
        n = len(man["parallel"]["ranks"])
        files, key = man["parallel"]["ranks"][rank]["shards"], f"rank{rank:02d}-of-{n:02d}/"
    t = {}
    for f in files:
        t.update(read_safetensors(out / f))
    P = key + layer["param_prefix"]
    if "layout" in meta:  # float Marlin: NVFP4 with its processed global scales
        act = torch.bfloat16 if meta.get("act", "bf16") == "bf16" else torch.float16
        p = fm.layout_params(t, P, meta["layout"], act)
        return dict(w13=p["w13"], s13=p["s13"], z13=None, w2=p["w2"], s2=p["s2"], z2=None,
                    type_id=p["type"], g13=p.get("g13"), g2=p.get("g2"))
    fmt, bits = meta["decode"], meta["bits"]
    w13, s13, z13, w2, s2, z2 = (t[P + n].cuda() if n else None for n in NAMES[fmt])
    return dict(w13=w13, s13=s13, z13=z13, w2=w2, s2=s2, z2=z2,
                type_id=UINT4 if fmt == "awq" else (UINT4B8 if bits == 4 else UINT8B128))


def rank_moe(x, p: dict, topk_ids, topk_w):
    return kernel_moe(x, p["w13"], p["s13"], p["z13"], p["w2"], p["s2"], p["z2"], topk_ids,
                      topk_w, p["type_id"], g13=p.get("g13"), g2=p.get("g2")).cpu()


def source_reference(src: dict, layer: dict, meta: dict, x, ids, w):
    """fp32 MoE of the unsharded source: each expert's gate/up/down decoded from the source
    checkpoint's own tensors (layouts.source_linear for WNA16, gpu_marlin_float.source_linear
    for the float formats), for the experts and weights the router chose."""
    pre = layer["module"] + ".experts"
    M, H = x.shape
    ref = torch.zeros(M, H)
    for e in range(layer["experts"]):
        p = f"{pre}.{e}."
        if "layout" in meta:  # [N, K] -> [K, N]
            Wg, Wu, Wd = (fm.source_linear(src, p + n + ".", meta["decode"]).float().T
                          for n in ("gate_proj", "up_proj", "down_proj"))
        else:
            Wg, Wu, Wd = (source_linear(src, p + n, meta["decode"], meta["bits"])
                          for n in ("gate_proj", "up_proj", "down_proj"))
        for m in range(M):
            for j in range(ids.shape[1]):
                if int(ids[m, j]) == e:
                    ref[m] += float(w[m, j]) * ((F.silu(x[m] @ Wg) * (x[m] @ Wu)) @ Wd)
    return ref


def run_case(case: Path) -> dict:
    meta = json.loads((case / "case.json").read_text())
    out = case / "out"
    man = json.loads((out / "moepack.json").read_text())
    src = {}
    for f in sorted((case / meta.get("src", "src")).glob("*.safetensors")):
        src.update(read_safetensors(f))
    layer = man["layers"][0]
    E, H = layer["experts"], layer["hidden"]
    act = torch.float16 if meta.get("act") == "fp16" else torch.bfloat16
    torch.manual_seed(0)
    M, topk = 48, 2
    x = torch.randn(M, H).to(act).cuda()
    topk_ids = torch.stack([torch.randperm(E)[:topk] for _ in range(M)]).to(torch.int32).cuda()
    topk_w = torch.softmax(torch.randn(M, topk), -1).float().cuda()
    par = man.get("parallel")
    y = torch.zeros(M, H)
    if par is None:
        y += rank_moe(x, rank_params(out, man, layer, None, meta), topk_ids, topk_w)
        what = "whole experts"
    elif par["tensor_parallel_size"] > 1:
        for r in range(par["tensor_parallel_size"]):
            y += rank_moe(x, rank_params(out, man, layer, r, meta), topk_ids, topk_w)
        what = f"TP {par['tensor_parallel_size']}: partial outputs summed"
    else:
        for r, rank in enumerate(par["ranks"]):
            local = {g: i for i, g in enumerate(rank["experts"])}
            ids = topk_ids.cpu().clone()
            w = topk_w.cpu().clone()
            for m in range(M):
                for j in range(topk):
                    g = int(ids[m, j])
                    ids[m, j] = local.get(g, 0)
                    if g not in local:
                        w[m, j] = 0.0
            y += rank_moe(x, rank_params(out, man, layer, r, meta), ids.to(torch.int32).cuda(),
                          w.cuda())
        what = (f"EP {par['expert_parallel_size']} ({par['expert_placement']}): tokens routed "
                "to the owners' local experts")
    ref = source_reference(src, layer, meta, x.float().cpu(), topk_ids.cpu(), topk_w.cpu())
    err = float((y - ref).norm() / ref.norm())
    expect = meta.get("expect", "pass")
    ok = err < RIGHT_TOL if expect == "pass" else err > WRONG_MIN
    decisions = [rk.get("layout_decisions") for rk in layer.get("ranks", [])]
    r = {"case": case.name, "what": what, "layout": man["layout"]["name"],
         "inter": layer["inter"], "norm_err_vs_fp32_source": err, "expect": expect, "ok": ok,
         "note": meta.get("note", ""), "rank_decisions": decisions}
    print(f"{case.name}: {man['layout']['name']} {what}; I={layer['inter']}; vs fp32 source "
          f"{err:.3e} (expect {expect}) {'OK' if ok else 'FAILED'} {meta.get('note', '')}"
          f"{' rank decisions ' + str(decisions) if any(decisions) else ''}", flush=True)
    return r


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("so")
    ap.add_argument("cases")
    ap.add_argument("--json")
    a = ap.parse_args()
    torch.ops.load_library(a.so)
    schema = str(torch.ops._moe_C.moe_wna16_marlin_gemm.default._schema)
    print("schema:", schema)
    for absent in ("g_idx", "perm", "is_k_full"):
        assert absent not in schema, f"{absent} in the schema: not vLLM 0.33's kernel"
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    results = []
    for c in sorted(Path(a.cases).iterdir()):
        if not (c / "case.json").exists():
            continue
        try:
            results.append(run_case(c))
        except Exception as e:  # noqa: BLE001 - reported per case, the run goes on
            print(f"{c.name}: EXCEPTION {type(e).__name__}: {str(e)[:300]}", flush=True)
            results.append({"case": c.name, "ok": False, "exception": f"{type(e).__name__}: {e}"})
    bad = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(bad)} of {len(results)} cases hold")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""GPU proof for tensor- and expert-parallel artifacts (issue 25, item 3): each rank's tensors of
a `convert --tensor-parallel-size N` / `--expert-parallel N` artifact through vLLM 0.33.0's own
moe_wna16_marlin_gemm (the shipped MoE kernel binary), combined as vLLM combines the ranks:

  tensor parallel: every rank runs the whole MoE on the same tokens with its I/N slice (gemm1 over
                   its w13, silu(gate)*up, gemm2 over its w2 with the router weights, top-k sum);
                   the partial outputs are summed over ranks (what the all-reduce adds);
  expert parallel: every rank runs only the (token, k) slots routed to its experts, by the local
                   ids of vLLM's expert map (the other slots get weight 0); outputs summed.

Each against the fp32 reference of the unsharded source checkpoint (layouts.source_linear), and
the TP-1 artifact of the same source through the same kernel. A case converted with
--vllm-w13-scale-size-k (vLLM's own loader permutation of the w13 scales, size_k = I/N) must fail
where group 128 and I/N <= 128 (the permutation the kernel does not read), next to the same case
converted by default, which must pass: both are printed.

  python gpu_parallel_kernel.py MOE_SO CASES_DIR [--json OUT.json]      (exit 0 when all hold)
CASES_DIR/<case>/{case.json, out/}; case.json: {"src" (the source directory, relative to the case;
default src/), "decode", "bits", "expect": "pass"|"fail", "note"}.
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
from gpu_marlin_kernel import UINT4, UINT4B8, UINT8B128, read_safetensors  # noqa: E402
from layouts import source_linear  # noqa: E402

RIGHT_TOL, WRONG_MIN = 2e-2, 0.1


def align(topk_ids: torch.Tensor, block: int, E: int):
    flat = topk_ids.flatten().tolist()
    ids, experts = [], []
    for e in range(E):
        idx = [i for i, v in enumerate(flat) if v == e]
        if not idx:
            continue
        pad = (-len(idx)) % block
        ids += idx + [len(flat)] * pad
        experts += [e] * ((len(idx) + pad) // block)
    if not ids:  # no slot on this rank: one padding block
        ids, experts = [len(flat)] * block, [0]
    mk = lambda v: torch.tensor(v, dtype=torch.int32, device="cuda")  # noqa: E731
    return mk(ids), mk(experts), mk([len(ids)])


def kernel_moe(x, w13, s13, z13, w2, s2, z2, topk_ids, topk_w, type_id):
    """One rank's MoE through vLLM's binary (fp32 [M, H]); I and H from the tensor shapes."""
    op = torch.ops._moe_C.moe_wna16_marlin_gemm
    M, topk, E = x.shape[0], topk_ids.shape[1], w13.shape[0]
    H, I = x.shape[1], w2.shape[1] * 16  # w2 [E, I/16, H*16/pf]: K = I (padded)
    block = 8
    sorted_ids, expert_ids, ntok = align(topk_ids, block, E)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ws = torch.zeros(sms * 4, dtype=torch.int32, device="cuda")
    c1 = torch.empty(M * topk, 2 * I, dtype=x.dtype, device="cuda")
    c1 = op(x, c1, w13, None, s13, None, None, z13, ws, sorted_ids, expert_ids, ntok, topk_w,
            block, topk, False, type_id, M, 2 * I, H, False, True, False, -1, -1, -1)
    act = (F.silu(c1[:, :I].float()) * c1[:, I:].float()).to(x.dtype)
    ws.zero_()
    c2 = torch.zeros(M * topk, H, dtype=x.dtype, device="cuda")
    c2 = op(act, c2, w2, None, s2, None, None, z2, ws, sorted_ids, expert_ids, ntok, topk_w,
            block, 1, True, type_id, M * topk, H, I, False, True, False, -1, -1, -1)
    return c2.view(M, topk, H).float().sum(1)


NAMES = {"gptq": ("w13_qweight", "w13_scales", None, "w2_qweight", "w2_scales", None),
         "awq": ("w13_qweight", "w13_scales", "w13_qzeros", "w2_qweight", "w2_scales",
                 "w2_qzeros")}


def rank_tensors(out: Path, man: dict, layer: dict, rank: int | None, fmt: str):
    if rank is None:
        files, key = [s["name"] for s in man["shards"]], ""
    else:
        n = len(man["parallel"]["ranks"])
        files, key = man["parallel"]["ranks"][rank]["shards"], f"rank{rank:02d}-of-{n:02d}/"
    t = {}
    for f in files:  # the rank's own files only
        t.update(read_safetensors(out / f))
    P = key + layer["param_prefix"]
    return [t[P + n].cuda() if n else None for n in NAMES[fmt]]


def source_reference(src: dict, layer: dict, fmt: str, bits: int, x, ids, w):
    pre = layer["param_prefix"].rstrip(".")
    if pre.endswith(".routed_experts"):
        pre = pre[: -len(".routed_experts")]
    M, H = x.shape
    ref = torch.zeros(M, H)
    for e in range(layer["experts"]):
        p = f"{pre}.{e}."
        Wg, Wu, Wd = (source_linear(src, p + n, fmt, bits) for n in ("gate_proj", "up_proj",
                                                                     "down_proj"))
        for m in range(M):
            for j in range(ids.shape[1]):
                if int(ids[m, j]) == e:
                    ref[m] += float(w[m, j]) * ((F.silu(x[m] @ Wg) * (x[m] @ Wu)) @ Wd)
    return ref


def run_case(case: Path) -> dict:
    meta = json.loads((case / "case.json").read_text())
    fmt, bits = meta["decode"], meta["bits"]
    out = case / "out"
    man = json.loads((out / "moepack.json").read_text())
    src = {}
    for f in sorted((case / meta.get("src", "src")).glob("*.safetensors")):
        src.update(read_safetensors(f))
    layer = man["layers"][0]
    E, H = layer["experts"], layer["hidden"]
    type_id = UINT4 if fmt == "awq" else (UINT4B8 if bits == 4 else UINT8B128)
    torch.manual_seed(0)
    M, topk = 48, 2
    x = torch.randn(M, H).to(torch.bfloat16).cuda()
    topk_ids = torch.stack([torch.randperm(E)[:topk] for _ in range(M)]).to(torch.int32).cuda()
    topk_w = torch.softmax(torch.randn(M, topk), -1).float().cuda()
    par = man.get("parallel")
    y = torch.zeros(M, H)
    if par is None:
        y += kernel_moe(x, *rank_tensors(out, man, layer, None, fmt), topk_ids, topk_w,
                        type_id).cpu()
        what = "whole experts"
    elif par["tensor_parallel_size"] > 1:
        for r in range(par["tensor_parallel_size"]):
            y += kernel_moe(x, *rank_tensors(out, man, layer, r, fmt), topk_ids, topk_w,
                            type_id).cpu()
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
            y += kernel_moe(x, *rank_tensors(out, man, layer, r, fmt), ids.to(torch.int32).cuda(),
                            w.cuda(), type_id).cpu()
        what = (f"EP {par['expert_parallel_size']} ({par['expert_placement']}): tokens routed "
                "to the owners' local experts")
    ref = source_reference(src, layer, fmt, bits, x.float().cpu(), topk_ids.cpu(), topk_w.cpu())
    err = float((y - ref).norm() / ref.norm())
    expect = meta.get("expect", "pass")
    ok = err < RIGHT_TOL if expect == "pass" else err > WRONG_MIN
    r = {"case": case.name, "what": what, "inter": layer["inter"], "norm_err_vs_fp32_source": err,
         "expect": expect, "ok": ok, "note": meta.get("note", "")}
    print(f"{case.name}: {what}; I={layer['inter']}; vs fp32 source {err:.3e} "
          f"(expect {expect}) {'OK' if ok else 'FAILED'} {meta.get('note', '')}", flush=True)
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
    results = [run_case(c) for c in sorted(Path(a.cases).iterdir()) if (c / "case.json").exists()]
    bad = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(bad)} of {len(results)} cases hold")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

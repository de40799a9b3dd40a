"""GPU test: moepack Marlin artifacts through vLLM 0.33.0's own MoE kernel binary.

vLLM's wheel ships its MoE kernels as _moe_C_stable_libtorch.abi3.so (stable libtorch ABI). This
loads it into the device's torch, checks the 0.33 schema of moe_wna16_marlin_gemm (no g_idx /
perm / is_k_full), and runs the plugin's kernel path -- gemm1 over w13, silu(gate)*up, gemm2 over
w2 with the router weights, top-k sum -- on converted GPTQ, AWQ and compressed-tensors int4/int8
layers, against (a) the CPU decode of the same parameters as the kernel reads them (layouts.py)
and (b) an fp32 reference from the source checkpoint. Gate/up halves swapped must fail.

  python gpu_marlin_kernel.py SO_PATH ARTIFACT_ROOT     (exit 0 when every check holds)
Needs only torch and a CUDA device.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from layouts import marlin_weight, source_linear  # noqa: E402

# vllm.scalar_type ids (vLLM 0.33.0): the kernel's b_type_id.
UINT4B8, UINT4, UINT8B128 = 1125899907892224, 1125899906843648, 1125899923621888
# The one-byte float types as raw bytes: the callers view them as the dtype the kernel takes.
_DT = {"I32": torch.int32, "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32,
       "U8": torch.uint8, "I8": torch.int8, "I64": torch.int64, "F8_E4M3": torch.uint8,
       "F8_E8M0": torch.uint8}
RIGHT_TOL, WRONG_MIN = 2e-2, 0.2


def read_safetensors(path: Path) -> dict:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        buf = bytearray(data[8 + n + b:8 + n + e])
        out[name] = torch.frombuffer(buf, dtype=_DT[t["dtype"]]).reshape(t["shape"]) if buf \
            else torch.empty(t["shape"], dtype=_DT[t["dtype"]])
    return out


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
    if not ids:  # no slot on these experts (an expert-parallel rank): one padding block
        ids, experts = [len(flat)] * block, [0]
    mk = lambda v: torch.tensor(v, dtype=torch.int32, device="cuda")  # noqa: E731
    return mk(ids), mk(experts), mk([len(ids)])


def by_kernel_order(t):
    """(w13, w2, s13, s2, z13, z2) -> (w13, s13, z13, w2, s2, z2)."""
    return t[0], t[2], t[4], t[1], t[3], t[5]


def kernel_moe(x, w13, s13, z13, w2, s2, z2, topk_ids, topk_w, type_id, I=None, H=None,
               block=8, g13=None, g2=None):
    """The plugin's kernel path, with vLLM's binary doing both GEMMs: gemm1 over w13,
    silu(gate) * up, gemm2 over w2 with the router weights, top-k sum (fp32 [M, H]). I (the
    intermediate size the parameters carry, padded) defaults to w2's K (w2 [E, I/16, ...]), H
    to x's width; g13 / g2 are NVFP4's processed global scales. Shared by the Marlin, float Marlin
    (bench/gpu_marlin_float.py) and tensor/expert-parallel (gpu_parallel_kernel.py) GPU runs."""
    op = torch.ops._moe_C.moe_wna16_marlin_gemm
    M, topk, E = x.shape[0], topk_ids.shape[1], w13.shape[0]
    I = w2.shape[1] * 16 if I is None else I  # noqa: E741
    H = x.shape[1] if H is None else H
    sorted_ids, expert_ids, ntok = align(topk_ids, block, E)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ws = torch.zeros(sms * 4, dtype=torch.int32, device="cuda")
    c1 = torch.empty(M * topk, 2 * I, dtype=x.dtype, device="cuda")
    c1 = op(x, c1, w13, None, s13, None, g13, z13, ws, sorted_ids, expert_ids, ntok, topk_w,
            block, topk, False, type_id, M, 2 * I, H, False, True, False, -1, -1, -1)
    act = (F.silu(c1[:, :I].float()) * c1[:, I:].float()).to(x.dtype)
    ws.zero_()
    # zeros: rows of slots no block covers stay 0 (an expert-parallel rank's padding block)
    c2 = torch.zeros(M * topk, H, dtype=x.dtype, device="cuda")
    c2 = op(act, c2, w2, None, s2, None, g2, z2, ws, sorted_ids, expert_ids, ntok, topk_w,
            block, 1, True, type_id, M * topk, H, I, False, True, False, -1, -1, -1)
    return c2.view(M, topk, H).float().sum(1)


def check_case(root: Path, name: str) -> list[str]:
    case = root / name
    meta = json.loads((case / "case.json").read_text())
    fmt, bits, family = meta["decode"], meta["bits"], meta["family"]
    man = json.loads((case / "out" / "moepack.json").read_text())
    out = read_safetensors(case / "out" / "model.safetensors")
    src = read_safetensors(case / "src" / "model.safetensors")
    L = man["layers"][0]
    E, H, I, P = L["experts"], L["hidden"], L["inter"], L["param_prefix"]
    names = {"gptq": ("w13_qweight", "w2_qweight", "w13_scales", "w2_scales", None, None),
             "awq": ("w13_qweight", "w2_qweight", "w13_scales", "w2_scales", "w13_qzeros",
                     "w2_qzeros"),
             "ct": ("w13_weight_packed", "w2_weight_packed", "w13_weight_scale",
                    "w2_weight_scale", None, None)}[fmt]
    t = [out[P + n].cuda() if n else None for n in names]
    type_id = UINT4 if fmt == "awq" else (UINT4B8 if bits == 4 else UINT8B128)
    torch.manual_seed(0)
    M, topk = 32, 2
    x = torch.randn(M, H).to(torch.bfloat16).cuda()
    topk_ids = torch.stack([torch.randperm(E)[:topk] for _ in range(M)]).to(torch.int32).cuda()
    topk_w = torch.softmax(torch.randn(M, topk), -1).float().cuda()

    y = kernel_moe(x, *by_kernel_order(t), topk_ids, topk_w, type_id, I, H).cpu()
    # (a) the CPU decode of the artifact, as the kernel reads it (bf16 rounding of the
    # intermediate like the kernel's output); (b) fp32 from the source tensors.
    xs, ids, ws = x.float().cpu(), topk_ids.cpu(), topk_w.cpu()
    pre = P.rstrip(".")
    gate, up, down = ("w1", "w3", "w2") if family == "mixtral" else (
        "gate_proj", "up_proj", "down_proj")
    ref_layout = torch.zeros(M, H)
    ref_src = torch.zeros(M, H)
    cpu = [v.cpu() if v is not None else None for v in t]
    for e in range(E):
        W13 = marlin_weight(cpu[0][e], cpu[2][e], None if cpu[4] is None else cpu[4][e], bits,
                            H, 2 * I)
        W2 = marlin_weight(cpu[1][e], cpu[3][e], None if cpu[5] is None else cpu[5][e], bits,
                           I, H)
        p = f"{pre}.{e}."
        Wg, Wu, Wd = (source_linear(src, p + n, fmt, bits) for n in (gate, up, down))
        for m in range(M):
            for j in range(topk):
                if int(ids[m, j]) != e:
                    continue
                h13 = xs[m] @ W13
                ref_layout[m] += float(ws[m, j]) * (
                    (F.silu(h13[:I]) * h13[I:]).to(torch.bfloat16).float() @ W2)
                ref_src[m] += float(ws[m, j]) * ((F.silu(xs[m] @ Wg) * (xs[m] @ Wu)) @ Wd)
    err_layout = float((y - ref_layout).norm() / ref_layout.norm())
    err_src = float((y - ref_src).norm() / ref_src.norm())

    # Gate and up halves swapped (weights and scales along N): must fail.
    def swap(w):
        half = w.shape[-1] // 2
        return torch.cat([w[..., half:], w[..., :half]], -1).contiguous()

    bad = list(t)
    bad[0], bad[2] = swap(t[0]), swap(t[2])
    if bad[4] is not None:
        bad[4] = swap(t[4])
    err_swap = float((kernel_moe(x, *by_kernel_order(bad), topk_ids, topk_w, type_id, I, H).cpu() - ref_src)
                     .norm() / ref_src.norm())
    line = (f"{name}: kernel vs CPU layout decode {err_layout:.3e}, vs fp32 source "
            f"{err_src:.3e}, gate/up swapped {err_swap:.3e}")
    print(line, flush=True)
    fails = []
    if not (err_layout < RIGHT_TOL and err_src < RIGHT_TOL):
        fails.append(line)
    if not err_swap > WRONG_MIN:
        fails.append(line + " (swap not caught)")
    return fails


def main() -> int:
    so, root = sys.argv[1], Path(sys.argv[2])
    torch.ops.load_library(so)
    schema = str(torch.ops._moe_C.moe_wna16_marlin_gemm.default._schema)
    print("schema:", schema)
    for absent in ("g_idx", "perm", "is_k_full"):
        assert absent not in schema, f"{absent} in the schema: not vLLM 0.33's kernel"
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    fails = []
    cases = sorted(p.name for p in root.iterdir() if (p / "case.json").exists())
    for name in cases:
        fails += check_case(root, name)
    print(f"{len(cases) - len(set(f.split(':')[0] for f in fails))} passed, "
          f"{len(set(f.split(':')[0] for f in fails))} failed")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

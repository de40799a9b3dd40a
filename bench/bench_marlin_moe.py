#!/usr/bin/env python3
# Invocation (on the GPU machine, after building with CUDA; bench/gpu_marlin_moe.sh does both):
#   python3 bench/bench_marlin_moe.py --lib build-gpu/bin/libmoepack_marlin_moe_bench.so \
#       --out $OUT/bench_marlin_moe.md
#
# Kernel benchmark of issue 12: the Qwen3-30B-A3B MoE layer (E=128, top-8, H=2048, I=768, GPTQ
# int4 g128 -> Marlin, bf16) at 1, 4, 16, 64, 256, 4096 tokens. Every timed thing is one CUDA graph
# replay; a 512 MiB buffer is written between iterations (L2 flush, outside the timed events);
# median of --iters (>= 50). Columns:
#   moepack fused Marlin: kernels/src/marlin_moe.cu through the C ABI (bench/marlin_moe_capi.cpp),
#     align + GEMM1/silu*up + GEMM2 + combine, fp32 output;
#   HBM floor: bytes of the experts the routing touches (Marlin words + scales of w13 and w2) /
#     device-to-device copy bandwidth measured in this run (2 x bytes per copy / time);
#   torch bf16: a grouped GEMM over the same routing (gather rows sorted by expert,
#     torch._grouped_mm with W13, silu(gate) * up, torch._grouped_mm with W2, weighted index_add;
#     a per-expert loop where _grouped_mm is missing), bf16 weights, in this process;
#   the reference figures (vLLM fused Marlin MoE and torch on an H100 80GB HBM3).
# The Marlin words are random int32: packing is a bijection from codes to words, so every word
# pattern is a legal tile of random uint4b8 codes (correctness is tests/cuda/marlin_moe_cuda.cpp).
import argparse
import ctypes
import statistics
import sys

import torch

REFERENCE = {  # issue 12, H100 80GB HBM3: tokens -> (HBM floor, vLLM fused Marlin, torch bf16) us
    1: (6.6, 34.8, 79.7),
    4: (24.1, 54.5, 157),
    16: (68.0, 107, 334),
    64: (104.5, 148, 493),
    256: (106, 217, 541),
    4096: (106, 1530, 1674),
}


def timed_graph(fn, flush, iters):
    """Median microseconds of one replay of fn captured in a CUDA graph, L2 flushed before each."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        flush.zero_()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    del graph
    return statistics.median(times)


def copy_bandwidth(iters):
    """Device-to-device copy bandwidth in bytes/s: (read + write) bytes / median time."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.fill_(1)
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return 2 * n / statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--tokens", default="1,4,16,64,256,4096")
    ap.add_argument("--profile", default="",
                    help="write per-kernel device times (torch.profiler, eager calls) here")
    args = ap.parse_args()
    assert args.iters >= 50

    lib = ctypes.CDLL(args.lib)
    lib.moepack_marlin_moe_workspace_bytes.restype = ctypes.c_size_t
    lib.moepack_marlin_moe_workspace_bytes.argtypes = [ctypes.c_int64] * 4 + [ctypes.c_int32]
    lib.moepack_marlin_moe_forward.restype = ctypes.c_int
    lib.moepack_marlin_moe_forward.argtypes = (
        [ctypes.c_int64] * 5 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 7 + [ctypes.c_int64,
        ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
        ctypes.c_int32])

    torch.manual_seed(0)
    dev = torch.device("cuda")
    E, H, I, K, GS = 128, 2048, 768, 8, 128
    G13, G2 = H // GS, I // GS
    i32 = torch.iinfo(torch.int32)
    w13 = torch.randint(i32.min, i32.max, (E, H // 16, 2 * 2 * I), dtype=torch.int32, device=dev)
    w2 = torch.randint(i32.min, i32.max, (E, I // 16, 2 * H), dtype=torch.int32, device=dev)
    s13 = (torch.rand(E, G13, 2 * I, device=dev) * 0.01 + 0.001).to(torch.bfloat16)
    s2 = (torch.rand(E, G2, H, device=dev) * 0.01 + 0.001).to(torch.bfloat16)
    expert_bytes = (w13[0].numel() * 4 + s13[0].numel() * 2 + w2[0].numel() * 4 +
                    s2[0].numel() * 2)
    # torch baseline weights (bf16, [N, K] like nn.Linear)
    W13 = (torch.randn(E, 2 * I, H, device=dev) * 0.02).to(torch.bfloat16)
    W2 = (torch.randn(E, H, I, device=dev) * 0.02).to(torch.bfloat16)
    W13t = W13.transpose(1, 2)  # [E, H, 2I], K-major: the layout _grouped_mm takes
    W2t = W2.transpose(1, 2)
    flush = torch.empty(512 << 20, dtype=torch.uint8, device=dev)
    torch_kinds = set()

    bw = copy_bandwidth(50)
    props = torch.cuda.get_device_properties(0)
    lines = []
    lines.append(f"device: {props.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    lines.append(f"layer: E={E} top-{K} H={H} I={I} int4 uint4b8 g{GS} Marlin, bf16; "
                 f"{expert_bytes} bytes per expert; median of {args.iters}, CUDA graphs, "
                 f"L2 flushed (512 MiB write) between iterations")
    lines.append(f"device-to-device copy bandwidth: {bw / 1e12:.3f} TB/s (2 x 1 GiB / median)")
    lines.append("")
    lines.append("| tokens | experts touched | HBM floor (us) | moepack fused Marlin (us) | "
                 "x floor | torch bf16 (us) | ref floor (us) | ref vLLM fused Marlin (us) | "
                 "ref torch bf16 (us) | vs vLLM ref |")
    lines.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")

    for T in [int(t) for t in args.tokens.split(",")]:
        x = (torch.randn(T, H, device=dev)).to(torch.bfloat16)
        logits = torch.randn(T, E, device=dev)
        probs = torch.softmax(logits, dim=-1)
        tw, ids = torch.topk(probs, K, dim=-1)
        tw = (tw / tw.sum(dim=-1, keepdim=True)).float().contiguous()
        ids = ids.to(torch.int32).contiguous()
        out = torch.empty(T, H, dtype=torch.float32, device=dev)
        ws_bytes = lib.moepack_marlin_moe_workspace_bytes(E, H, I, T, K)
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device=dev)

        def marlin(block_rows=0):
            err = lib.moepack_marlin_moe_forward(
                E, H, I, G13, G2, 1, 1, w13.data_ptr(), s13.data_ptr(), w2.data_ptr(),
                s2.data_ptr(), x.data_ptr(), ids.data_ptr(), tw.data_ptr(), T, K,
                out.data_ptr(), ws.data_ptr(), ws_bytes, torch.cuda.current_stream().cuda_stream,
                block_rows)
            if err != 0:
                raise RuntimeError(f"moepack_marlin_moe_forward: cudaError {err}")

        # torch grouped GEMM over the same routing: rows sorted by expert (index tensors fixed
        # before capture), torch._grouped_mm over all experts when this torch has it (one GEMM
        # per projection), else one GEMM pair per touched expert.
        flat_ids = ids.flatten().long()
        order = torch.argsort(flat_ids, stable=True)
        tok_sorted = (order // K).contiguous()
        w_sorted = tw.flatten()[order].to(torch.bfloat16)[:, None].contiguous()
        counts = torch.bincount(flat_ids, minlength=E)
        offs = torch.cumsum(counts, 0).to(torch.int32)
        counts_host = counts.tolist()
        groups = []
        begin = 0
        for e in range(E):
            if counts_host[e]:
                groups.append((e, tok_sorted[begin:begin + counts_host[e]],
                               w_sorted[begin:begin + counts_host[e]]))
            begin += counts_host[e]
        out_t = torch.zeros(T, H, dtype=torch.bfloat16, device=dev)

        def torch_loop():
            out_t.zero_()
            for e, tok, wt in groups:
                h = x.index_select(0, tok) @ W13[e].t()
                a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
                out_t.index_add_(0, tok, (a @ W2[e].t()) * wt)

        def torch_grouped():
            xs = x.index_select(0, tok_sorted)
            h = torch._grouped_mm(xs, W13t, offs=offs)
            a = torch.nn.functional.silu(h[:, :I]) * h[:, I:]
            y = torch._grouped_mm(a, W2t, offs=offs) * w_sorted
            out_t.zero_()
            out_t.index_add_(0, tok_sorted, y)

        torch_moe, torch_kind = torch_loop, "per-expert loop"
        if hasattr(torch, "_grouped_mm"):
            try:
                torch_loop()
                ref = out_t.float().clone()
                torch_grouped()
                torch.cuda.synchronize()
                if torch.allclose(out_t.float(), ref, rtol=3e-2, atol=3e-2 * ref.abs().max().item()):
                    torch_moe, torch_kind = torch_grouped, "torch._grouped_mm"
                else:
                    print(f"torch._grouped_mm disagrees with the loop at {T} tokens; using the loop")
            except Exception as ex:  # noqa: BLE001 -- any failure means: use the loop
                print(f"torch._grouped_mm unavailable ({ex}); using the loop")
        torch_kinds.add(torch_kind)

        touched = len(groups)
        floor_us = touched * expert_bytes / bw * 1e6
        t_marlin = timed_graph(marlin, flush, args.iters)
        t_torch = timed_graph(torch_moe, flush, args.iters)
        rf, rv, rt = REFERENCE.get(T, (float("nan"),) * 3)
        verdict = "at or below" if t_marlin <= rv else "above"
        lines.append(f"| {T} | {touched} | {floor_us:.1f} | {t_marlin:.1f} | "
                     f"{t_marlin / floor_us:.2f} | {t_torch:.1f} | {rf} | {rv} | {rt} | "
                     f"{verdict} ({t_marlin / rv:.2f}x) |")
        print(lines[-1], flush=True)
        if args.profile:
            # Both block shapes, whatever the launcher picks (the crossover is tuned from this).
            forced = {bm: timed_graph(lambda bm=bm: marlin(bm), flush, args.iters) for bm in (16, 64)}
            with open(args.profile, "a") as f:
                f.write(f"== {T} tokens: block_rows 16: {forced[16]:.1f} us, "
                        f"64: {forced[64]:.1f} us\n")
            from torch.profiler import ProfilerActivity, profile
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(10):
                    flush.zero_()
                    marlin()
                torch.cuda.synchronize()
            with open(args.profile, "a") as f:
                f.write(f"== {T} tokens: 10 eager calls, L2 flushed before each\n")
                f.write(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8) + "\n")
        if not torch.isfinite(out).all():
            raise RuntimeError(f"non-finite kernel output at {T} tokens")

    lines.append("")
    lines.append("torch bf16 baseline: " + ", ".join(sorted(torch_kinds)))
    text = "\n".join(lines) + "\n"
    print(text)
    with open(args.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    sys.exit(main())

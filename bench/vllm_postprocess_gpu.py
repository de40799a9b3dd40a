"""What the moepack-vllm plugin removes from vLLM 0.33's start-up: the Marlin MoE post-processing
of a GPTQ int4 checkpoint, timed with vLLM's own repack op on the GPU.

Stock vLLM 0.33 serving a GPTQ MoE checkpoint with the Marlin backend runs, per MoE layer and
after the weights are on the GPU (`_process_weights_marlin`): w13/w2 transposed to N-first and
back, `gptq_marlin_repack` per expert for w13 and w2, and the Marlin scale permutation. This runs
that sequence (vLLM's `torch.ops._C.gptq_marlin_repack` from the 0.33.0 wheel's
`_C_stable_libtorch.abi3.so`, the permutations in torch) on random codes of the given shape, for
every layer, and reports the total. The plugin's post-processing is two attribute aliases and the
kernel object (timed too). Loading the bytes (disk -> GPU) is the same for both: the artifact is
the source's size.

  python vllm_postprocess_gpu.py C_SO LAYERS EXPERTS HIDDEN INTER [GROUP]
"""

import sys
import time

import torch


def scale_perm_grouped(s: torch.Tensor) -> torch.Tensor:
    e, g, n = s.shape
    return s.reshape(e, -1, 8, 8).transpose(2, 3).reshape(e, g, n).contiguous()


def main():
    so, layers, E, H, I = sys.argv[1], *map(int, sys.argv[2:6])
    group = int(sys.argv[6]) if len(sys.argv) > 6 else 128
    torch.ops.load_library(so)
    repack = torch.ops._C.gptq_marlin_repack
    dev = "cuda"
    bits, pf = 4, 8
    g = torch.Generator(device=dev).manual_seed(0)

    def rand_i32(*shape):
        return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, device=dev, generator=g)

    # One layer's checkpoint-format tensors as vLLM's GPTQ MoE method creates them (K-first).
    w13 = rand_i32(E, H // pf, 2 * I)
    w2 = rand_i32(E, I // pf, H)
    s13 = torch.rand(E, H // group, 2 * I, dtype=torch.bfloat16, device=dev, generator=g)
    s2 = torch.rand(E, I // group, H, dtype=torch.bfloat16, device=dev, generator=g)

    def stock_layer():
        # Normalise to N-first and back (what AutoGPTQMoEMethod + _process_weights_marlin do),
        # repack each expert, permute the scales.
        a = w13.transpose(1, 2).contiguous().transpose(1, 2).contiguous()
        b = w2.transpose(1, 2).contiguous().transpose(1, 2).contiguous()
        out13 = torch.empty(E, H // 16, 2 * I * 16 // pf, dtype=torch.int32, device=dev)
        out2 = torch.empty(E, I // 16, H * 16 // pf, dtype=torch.int32, device=dev)
        for e in range(E):
            out13[e] = repack(a[e], H, 2 * I, bits, False)
            out2[e] = repack(b[e], I, H, bits, False)
        p13 = scale_perm_grouped(s13)
        p2 = scale_perm_grouped(s2) if s2.shape[1] > 1 else s2.clone()
        return out13, out2, p13, p2

    stock_layer()  # warm-up (module load, allocator)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(layers):
        stock_layer()
    torch.cuda.synchronize()
    stock = time.perf_counter() - t0

    class L:  # the plugin's post-processing: aliases only
        pass

    t0 = time.perf_counter()
    for _ in range(layers):
        x = L()
        x.w13_weight, x.w2_weight = w13, w2
    plugin = time.perf_counter() - t0
    gb = layers * (w13.numel() + w2.numel()) * 4 / 1e9
    print(f"device {torch.cuda.get_device_name(0)}; {layers} layers x {E} experts, H={H} "
          f"I={I} int4 g{group} ({gb:.2f} GB of expert codes)")
    print(f"stock vLLM 0.33 Marlin MoE post-processing: {stock:.3f} s "
          f"({stock / layers * 1e3:.1f} ms/layer)")
    print(f"moepack-vllm post-processing (aliases): {plugin * 1e3:.3f} ms")


if __name__ == "__main__":
    main()

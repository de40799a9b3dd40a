"""One rank of a tensor- or expert-parallel moepack artifact in vLLM 0.33.0 on the CPU: a process
of a real 2-process gloo group (vLLM's init_distributed_environment / initialize_model_parallel,
its CPU communicator), the model built and loaded by vLLM's own config and DefaultModelLoader at
--tensor-parallel-size N (with --enable-expert-parallel for EP) with the moepack-vllm plugin, then
the first MoE block run on fixed hidden states with the CPU stand-ins of test_serving_forward.py
for the CUDA-only Marlin ops. vLLM's own all-reduce (gloo) sums the ranks' partial outputs.

Run by test_serving_parallel.py, once per rank:
  parallel_worker.py DST SRC RANK WORLD PORT OUT [tp | ep | ep-round_robin]
                    [wna16 | float | humming]
Writes OUT (torch.save): the rank's loaded expert parameters, the source's as stock vLLM loads
them on the rank (load_source_as_vllm), the safetensors files vLLM's loader opened for tensors,
the block's input, its rank-local (pre-all-reduce) and all-reduced outputs, and the routing the
stand-ins saw.
"""

from __future__ import annotations

import sys

import vllm_harness as h  # noqa: F401  (VLLM_TARGET_DEVICE=cpu before vLLM is imported)


class _Patch:
    """monkeypatch.setattr for a process without pytest's fixture."""

    @staticmethod
    def setattr(obj, name, value):
        setattr(obj, name, value)


def load_source_as_vllm(source: str, over: dict) -> dict:
    """The source checkpoint's expert parameters as stock vLLM 0.33 loads them on this rank:
    its GPTQ MoE method's create_weights and RoutedExperts.weight_loader (narrowing by tp_rank /
    the expert map) in this process group. vLLM's WNA16 oracle finds no backend on the CPU, so
    its pick is forced to MARLIN, and process_weights_after_loading (the CUDA repack) is
    skipped: the parameters are the loaded checkpoint slices."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
    from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import WNA16MoEBackend
    from vllm.model_executor.layers.quantization import auto_gptq
    from vllm.model_executor.model_loader import base_loader, get_model

    saved = auto_gptq.select_wna16_moe_backend, base_loader.process_weights_after_loading
    auto_gptq.select_wna16_moe_backend = lambda *a, **k: (WNA16MoEBackend.MARLIN, MarlinExperts)
    base_loader.process_weights_after_loading = lambda *a, **k: None
    try:
        cfg = h.engine_config(source, **over)
        with set_current_vllm_config(cfg):
            model = get_model(vllm_config=cfg)
        return {n: p.data.clone() for n, p in model.named_parameters() if ".experts." in n}
    finally:
        auto_gptq.select_wna16_moe_backend, base_loader.process_weights_after_loading = saved


def pretend_hopper_with_emulated_humming():
    """kind "humming": test_serving_humming.py's pretend_hopper stubs (vLLM's Humming experts
    selectable, locks on the CPU, the GPU's SM 90) and bench/humming/humming_emu.py's CPU
    emulation of humming's three CUDA weight kernels with an H100's DeviceInfo, so that stock
    vLLM's own Humming post-processing of the source runs on this rank's slice (humming_emu
    equals the real kernels on the H100, 23/23)."""
    from pathlib import Path

    import torch
    from vllm.model_executor.layers.fused_moe.experts import fused_humming_moe

    from moepack_vllm import humming_builder

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "humming"))
    import humming.tune as htune
    import humming_emu

    humming_emu.install()
    fused_humming_moe.HummingExpertsBase._supports_current_device = staticmethod(lambda: True)
    fused_humming_moe.create_humming_locks = lambda device: torch.zeros(132 * 8,
                                                                        dtype=torch.int32)
    humming_builder.device_sm = lambda: 90
    htune.get_device_index = lambda device=None: 0


def load_source_as_vllm_humming(source: str, over: dict) -> dict:
    """The source checkpoint's expert parameters as stock vLLM 0.33 holds them on this rank after
    process_weights_after_loading on an H100: its GPTQ MoE method, RoutedExperts.weight_loader
    narrowing by tp_rank / the expert map, then its oracle's pick on sm90 (HUMMING, with the
    experts class vLLM's select_wna16_moe_backend takes for the deployment: indexed without EP,
    grouped with EP) and its own Humming post-processing of the rank's slice."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.oracle.int_wna16 import (
        WNA16MoEBackend,
        backend_to_kernel_cls,
    )
    from vllm.model_executor.layers.quantization import auto_gptq
    from vllm.model_executor.model_loader import get_model

    def pick(config, *a, **k):
        import vllm.model_executor.layers.fused_moe.modular_kernel as mk

        fmt = mk.FusedMoEActivationFormat.Standard
        for cls in backend_to_kernel_cls(WNA16MoEBackend.HUMMING):
            if cls.is_supported_config(cls, config, a[0] if a else None, None, fmt)[0]:
                return WNA16MoEBackend.HUMMING, cls
        raise AssertionError("no Humming experts class for this deployment")

    import vllm.platforms as vp
    from vllm.platforms.interface import DeviceCapability

    # check_and_fallback_input_schema asks the platform for the SM (an H100's, for the source
    # model only: the plugin's model is built on vLLM's CPU platform as it is).
    saved = auto_gptq.select_wna16_moe_backend, vp.current_platform.get_device_capability
    auto_gptq.select_wna16_moe_backend = pick
    vp.current_platform.get_device_capability = lambda *a, **k: DeviceCapability(9, 0)
    try:
        cfg = h.engine_config(source, **over)
        with set_current_vllm_config(cfg):
            model = get_model(vllm_config=cfg)
        out = {n: p.data.clone() for n, p in model.named_parameters() if ".experts." in n}
        for n, m in model.named_modules():
            if hasattr(m, "humming_configs"):
                out[n + ".humming_configs"] = {k: v.to_str() for k, v in
                                               m.humming_configs.items()}
        return out
    finally:
        auto_gptq.select_wna16_moe_backend, vp.current_platform.get_device_capability = saved


def float_marlin_stand_ins():
    """test_serving_marlin_float.py's setting for the float Marlin layouts: its stand-ins, and
    pretend_ampere's two stubs (MarlinExperts runs here; vLLM's CPU FP8 experts do not), with
    vLLM's FP8 post-processing forbidden (path a must transform nothing)."""
    from test_serving_marlin_float import FloatStandIns
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import MarlinExperts
    from vllm.model_executor.layers.fused_moe.oracle.fp8 import (
        Fp8MoeBackend,
        backend_to_kernel_cls,
    )
    from vllm.model_executor.layers.quantization import fp8 as vllm_fp8

    def no_transform(*a, **kw):
        raise AssertionError("vLLM transformed pre-processed weights")

    MarlinExperts._supports_current_device = staticmethod(lambda: True)
    for backend in (Fp8MoeBackend.CPU, Fp8MoeBackend.CPU_W8A8):
        for cls in backend_to_kernel_cls(backend):
            cls._supports_current_device = staticmethod(lambda: False)
    vllm_fp8.convert_to_fp8_moe_kernel_format = no_transform
    return FloatStandIns(_Patch())


def main(dst: str, source: str, rank: int, world: int, port: int, out: str,
         mode: str = "tp", kind: str = "wna16") -> None:
    import json

    import torch

    import moepack_vllm
    from test_serving_forward import StandIns
    from vllm.config import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.distributed import parallel_state
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.model_loader import default_loader, get_model

    moepack_vllm.register()
    if kind == "humming":
        pretend_hopper_with_emulated_humming()
    stand = float_marlin_stand_ins() if kind == "float" else StandIns(_Patch())
    files: list[str] = []
    iterate = default_loader.safetensors_weights_iterator

    def recording_iterator(hf_weights_files, *a, **kw):
        files.extend(str(f) for f in hf_weights_files)
        return iterate(hf_weights_files, *a, **kw)

    over = dict(tensor_parallel_size=world)
    if mode.startswith("ep"):
        over["enable_expert_parallel"] = True
        over["expert_placement_strategy"] = mode.partition("-")[2] or "linear"
    cfg = h.engine_config(dst, **over)
    with set_current_vllm_config(cfg):
        init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(world, 1)
    source_params = (load_source_as_vllm(source, over) if kind == "wna16" else
                     load_source_as_vllm_humming(source, over) if kind == "humming" else {})
    default_loader.safetensors_weights_iterator = recording_iterator
    with set_current_vllm_config(cfg):
        model = get_model(vllm_config=cfg)
    manifest = json.loads(open(f"{dst}/moepack.json").read())
    L = manifest["layers"][0]
    params = {n: p.data.clone() for n, p in model.named_parameters() if ".experts." in n}
    qc = model.get_submodule(L["module"] + ".experts.routed_experts").quant_method
    if kind == "humming":  # no forward: humming's kernels are JIT-compiled for a GPU
        experts = model.get_submodule(L["module"] + ".experts.routed_experts")
        torch.save({"params": params, "source": source_params, "files": files,
                    "rank": qc.manifest.rank,
                    "humming_configs": {k: v.to_str() for k, v in
                                        experts.humming_configs.items()},
                    "experts_cls": type(qc.moe_kernel.fused_experts).__name__
                    if hasattr(qc, "moe_kernel") else None}, out)
        return
    block = model.get_submodule(L["module"])
    torch.manual_seed(0)
    x = torch.randn(16, L["hidden"]).to(torch.bfloat16)
    partial = []
    tp_group = parallel_state.get_tp_group()
    all_reduce = tp_group.all_reduce

    def recording_all_reduce(t):
        partial.append(t.detach().float().clone())
        return all_reduce(t)

    tp_group.all_reduce = recording_all_reduce
    with set_current_vllm_config(cfg), set_forward_context(None, cfg, num_tokens=x.shape[0]):
        y = block(x).float()
    torch.save({"params": params, "source": source_params, "files": files, "x": x, "y": y,
                "partial": partial,
                "topk_ids": stand.topk_ids, "topk_weights": stand.topk_weights,
                "rank": qc.manifest.rank}, out)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), a[5], *(a[6:8]))

"""Humming's tuning tables stored in a moepack artifact (issue 23 item 5).

vLLM 0.33's HummingIndexedExperts.init_humming_moe asks humming-kernels'
`get_heuristics_config(layer_config, use_f16_accum, use_batch_invariant, gemm_type)` for each
sublayer's table of (min_m, max_m, kernel config); on an H100 that is ~2.5 s per sublayer shape
(pure Python, lru-cached per process), ~5 s per distinct MoE layer shape at every start.
The tables are a function of the LayerConfig, those three flags, humming's version and the
DeviceInfo fields its heuristics read (no timing, no GPU work), so they can be computed ahead
of time on a CPU for a named GPU:

    moepack-vllm seed-tuning ARTIFACT_DIR --gpu h100-sxm

writes ARTIFACT_DIR/humming_tuning.json. At load the plugin hands vLLM these tables instead of
computing them when humming's version, the flags and every recorded DeviceInfo field equal
this GPU's; otherwise it logs why and vLLM computes them as stock does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import types
from pathlib import Path

TUNING_FILE = "humming_tuning.json"
FORMAT = "moepack-humming-tuning/1"
logger = logging.getLogger("moepack_vllm")

# What humming-kernels' DeviceInfo extension reports, per named GPU (the fields its tuning reads:
# name for the H20 class, sm_version for the class, sm_count, shared memory, threads/registers).
GPUS = {
    "h100-sxm": {"name": "NVIDIA H100 80GB HBM3", "is_ppu": False, "sm_count": 132,
                 "sm_major": 9, "sm_minor": 0, "sm_version": 90, "max_threads_per_block": 1024,
                 "max_threads_per_sm": 2048, "max_registers_per_sm": 65536,
                 "l2_cache_size": 50 * 1024 * 1024, "max_smem_size": 232448,
                 "default_smem_size": 49152},
}
DEFAULT_GPU = {"sm90": "h100-sxm"}


def _flags(use_f16_accum: bool = False, use_batch_invariant: bool = False,
           gemm_type: str = "indexed") -> dict:
    return {"use_f16_accum": bool(use_f16_accum), "use_batch_invariant": bool(use_batch_invariant),
            "gemm_type": str(gemm_type)}


@contextlib.contextmanager
def _device_as(fields: dict):
    """humming's DeviceInfo answering `fields` (nothing else touched), lru cache cleared."""
    import humming.device as hdev
    import humming.tune as ht

    value = types.SimpleNamespace(index=0, **fields)

    def new(cls, index=None):  # no CUDA driver asked (DeviceInfo(i) builds the extension's)
        inst = object.__new__(cls)
        object.__setattr__(inst, "_index", 0)
        object.__setattr__(inst, "_value", value)
        return inst

    saved = {k: hdev.DeviceInfo.__dict__[k] for k in ("__new__", "_get_value")}
    hdev.DeviceInfo.__new__ = new
    hdev.DeviceInfo._get_value = lambda self: value
    ht._get_heuristics_config.cache_clear()
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(hdev.DeviceInfo, k, v)
        ht._get_heuristics_config.cache_clear()


def compute_tables(layer_configs: list[str], gpu: str, flags: dict) -> dict:
    """humming's own tables for each LayerConfig JSON string, as on `gpu` (JSON round trip)."""
    import humming.tune as ht
    from humming.config import GemmType, LayerConfig

    out = {}
    with _device_as(GPUS[gpu]):
        for s in layer_configs:
            table = ht._get_heuristics_config(
                LayerConfig(**json.loads(s)), None, flags["use_f16_accum"],
                flags["use_batch_invariant"], False, GemmType(flags["gemm_type"]), 0, False)
            out[s] = json.loads(json.dumps(table))
    return out


def seed(artifact: Path, gpu: str | None = None) -> Path:
    from importlib.metadata import version

    m = json.loads((artifact / "moepack.json").read_text())
    if m.get("backend") != "humming":
        raise SystemExit(f"{artifact}: backend {m.get('backend')!r}, not humming: no tables")
    gpu = gpu or DEFAULT_GPU.get(m.get("target_arch", ""))
    if gpu not in GPUS:
        raise SystemExit(f"--gpu: one of {sorted(GPUS)} (got {gpu!r})")
    configs = sorted({L["layout_config"][f"{sub}_layer_config"] for L in m["layers"]
                      for sub in ("w13", "w2")})
    flags = _flags()
    t0 = time.perf_counter()
    tables = compute_tables(configs, gpu, flags)
    doc = {"format": FORMAT, "kernel_package": "humming-kernels",
           "kernel_version": version("humming-kernels"), "gpu": gpu, "device": GPUS[gpu],
           "flags": flags, "tables": tables}
    path = artifact / TUNING_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)
    print(f"{path}: {len(tables)} tables for {gpu} in {time.perf_counter() - t0:.1f} s")
    return path


def _mismatch(doc: dict, flags: dict) -> str | None:
    """Why the stored tables are not this process's, or None."""
    from importlib.metadata import version

    from humming.device import DeviceInfo

    if doc.get("format") != FORMAT:
        return f"format {doc.get('format')!r}"
    have = version("humming-kernels")
    if doc.get("kernel_version") != have:
        return f"computed with humming-kernels {doc.get('kernel_version')}, this is {have}"
    if doc.get("flags") != flags:
        return f"computed for {doc.get('flags')}, vLLM asks {flags}"
    info = DeviceInfo(None)
    for k, v in doc.get("device", {}).items():
        got = getattr(info, k)
        if got != v:
            return f"computed for {doc.get('gpu')} ({k} {v!r}), this GPU has {k} {got!r}"
    return None


def load(artifact: Path) -> dict | None:
    p = artifact / TUNING_FILE
    return json.loads(p.read_text()) if p.exists() else None


@contextlib.contextmanager
def seeded(artifact: Path, where: str):
    """While vLLM builds a layer's Humming experts: its get_heuristics_config answers from the
    artifact's stored tables where they fit this process, else computes as stock does."""
    import vllm.utils.humming as vh

    doc = load(artifact)
    if doc is None:
        yield
        return
    stock = getattr(vh, "get_heuristics_config")
    checked: dict = {}

    def get_heuristics_config(layer_config, shape_m=None, use_f16_accum=False,
                              use_batch_invariant=False, use_m_major_input_scale=False,
                              gemm_type="dense", device=None):
        from humming.config import GemmType

        flags = _flags(use_f16_accum, use_batch_invariant, GemmType(gemm_type).value)
        key = layer_config.to_str() if hasattr(layer_config, "to_str") else None
        if shape_m is None and not use_m_major_input_scale and key in doc["tables"]:
            if "why" not in checked:
                checked["why"] = _mismatch(doc, flags)
                if checked["why"]:
                    logger.warning("%s: %s not used (%s); computing humming's tuning tables "
                                   "as stock vLLM does", where, TUNING_FILE, checked["why"])
            if not checked["why"]:
                return doc["tables"][key]
        return stock(layer_config=layer_config, shape_m=shape_m, use_f16_accum=use_f16_accum,
                     use_batch_invariant=use_batch_invariant,
                     use_m_major_input_scale=use_m_major_input_scale, gemm_type=gemm_type,
                     device=device)

    vh.get_heuristics_config = get_heuristics_config
    try:
        yield
    finally:
        vh.get_heuristics_config = stock


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="moepack-vllm")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("seed-tuning", help="store humming's tuning tables for a named GPU in a "
                                           "moepack `humming` artifact (computed on the CPU)")
    s.add_argument("artifact", type=Path)
    s.add_argument("--gpu", choices=sorted(GPUS), default=None,
                   help="default: the artifact's target arch's GPU (sm90: h100-sxm)")
    a = ap.parse_args(argv)
    seed(a.artifact, a.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())

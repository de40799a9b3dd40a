"""Fixtures: tiny source checkpoints made by `moepack synth` and converted by `moepack convert`
(the binary under test: $MOEPACK_BIN, default build/bin/moepack)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MOEPACK = os.environ.get("MOEPACK_BIN", str(ROOT / "build" / "bin" / "moepack"))


def moepack(*args: str) -> None:
    subprocess.run([MOEPACK, *args, "--threads", "1"], check=True, stdout=subprocess.DEVNULL)


class Artifacts:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cache: dict[tuple, tuple[Path, Path]] = {}

    def get(self, fmt: str, family: str = "qwen3", *convert_flags: str, **synth) -> tuple[Path, Path]:
        """(source, converted) for a synth format/family and convert flags (cached)."""
        key = (fmt, family, convert_flags, tuple(sorted(synth.items())))
        if key not in self.cache:
            name = f"{len(self.cache)}-{fmt}-{family}"
            src, dst = self.root / f"{name}-src", self.root / f"{name}-out"
            args = ["synth", str(src), "--format", fmt, "--family", family, "--layers", "2"]
            opts = {"experts": 4, "hidden": 256, "inter": 128, "vocab": 256, **synth}
            for k, v in opts.items():
                args += [f"--{k.replace('_', '-')}", str(v)]
            moepack(*args)
            moepack("convert", str(src), str(dst), *convert_flags)
            self.cache[key] = (src, dst)
        return self.cache[key]

    def converted(self, src: Path, name: str, *convert_flags: str) -> Path:
        """`moepack convert` of an existing checkpoint directory (a committed fixture), cached
        under `name`."""
        key = ("converted", str(src), name, convert_flags)
        if key not in self.cache:
            dst = self.root / f"{len(self.cache)}-{name}-out"
            moepack("convert", str(src), str(dst), *convert_flags)
            self.cache[key] = (src, dst)
        return self.cache[key][1]

    def edited_copy(self, dst: Path, name: str) -> Path:
        out = self.root / name
        if out.exists():
            shutil.rmtree(out)
        shutil.copytree(dst, out)
        return out


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Artifacts:
    if not os.access(MOEPACK, os.X_OK):
        pytest.skip(f"no moepack binary at {MOEPACK} (set MOEPACK_BIN)")
    return Artifacts(tmp_path_factory.mktemp("artifacts"))


def edit_config(d: Path, **quant_fields) -> None:
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    cfg["quantization_config"].update(quant_fields)
    p.write_text(json.dumps(cfg, indent=2))


def edit_manifest(d: Path, fn) -> None:
    """Applies fn to moepack.json's JSON and rewrites it, with config.json's manifest_sha256
    following (so that only the edit, not the digest check, is under test)."""
    p = d / "moepack.json"
    m = json.loads(p.read_text())
    fn(m)
    data = (json.dumps(m, indent=2) + "\n").encode()
    p.write_bytes(data)
    edit_config(d, manifest_sha256=hashlib.sha256(data).hexdigest())


@pytest.fixture(scope="session")
def plugin():
    """Registers moepack-vllm in this process, as vLLM's plugin loader would (VLLM_PLUGINS=none
    keeps vLLM from loading it by itself, so the stock tests that run first see stock vLLM).
    Registration lasts for the whole pytest process: a test file using this fixture (or importing
    moepack_vllm.moe/config) must sort after test_serving.py, whose stock-vLLM refusals run first."""
    import moepack_vllm

    moepack_vllm.register()
    return moepack_vllm


def experts_params(model):
    return {n: p for n, p in model.named_parameters() if ".experts." in n}


def assert_byte_identical(model, dst):
    """Every manifest parameter exists under `...experts.routed_experts.` with the checkpoint's
    exact dtype, shape and bytes; returns how many were checked."""
    import torch
    from safetensors.torch import load_file

    manifest = json.loads((dst / "moepack.json").read_text())
    tensors = {}
    for shard in manifest["shards"]:
        tensors.update(load_file(str(dst / shard["name"])))
    params = experts_params(model)
    checked = 0
    for layer in manifest["layers"]:
        for name in layer["params"]:
            local = name[len(layer["param_prefix"]):]
            pname = f"{layer['module']}.experts.routed_experts.{local}"
            assert pname in params, f"{pname} not created (have {sorted(params)[:6]}...)"
            got, want = params[pname].data, tensors[name]
            assert got.dtype == want.dtype and got.shape == want.shape, name
            assert torch.equal(got.contiguous().view(torch.uint8),
                               want.contiguous().view(torch.uint8)), f"{name}: bytes differ"
            checked += 1
    assert checked > 0
    return checked

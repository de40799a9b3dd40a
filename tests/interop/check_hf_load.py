#!/usr/bin/env python3
"""Checks that a checkpoint directory written by moepack loads with Hugging Face's own
`safetensors` package (the reference Rust reader behind transformers and vLLM).

For every shard (model.safetensors, or the shards named by model.safetensors.index.json):
  * safetensors.deserialize() -- the reference validator -- accepts the whole file and yields
    every tensor's dtype, shape and raw bytes;
  * safe_open(framework="numpy") opens it, its __metadata__ has format "pt", and every tensor's
    header dtype/shape (get_slice) agrees; tensors of dtypes numpy has are materialised with
    get_tensor() and must equal the raw bytes; with torch importable, safetensors.torch.load_file
    must load every tensor (bf16 and fp8 included) with the same bytes.
The index, when present, must map every tensor to the shard that holds it (and nothing else)
with the right total_size. When moepack.json is present, every tensor it records must be
there with the recorded shard, dtype, shape, byte count and SHA-256, and nothing more.

Exit 0 when everything holds, 1 with a list of problems otherwise.
"""

import hashlib
import json
import os
import sys

import numpy as np
import safetensors
from safetensors import safe_open

# safetensors dtype -> numpy dtype, for the dtypes numpy can hold (no bf16, no fp8).
NUMPY_DTYPES = {
    "BOOL": np.bool_,
    "U8": np.uint8,
    "I8": np.int8,
    "I16": np.int16,
    "U16": np.uint16,
    "F16": np.float16,
    "I32": np.int32,
    "U32": np.uint32,
    "F32": np.float32,
    "F64": np.float64,
    "I64": np.int64,
    "U64": np.uint64,
}


def shard_files(root, problems):
    """The shard file names to load, from the index when there is one."""
    index_path = os.path.join(root, "model.safetensors.index.json")
    if not os.path.exists(index_path):
        if not os.path.exists(os.path.join(root, "model.safetensors")):
            problems.append("neither model.safetensors nor model.safetensors.index.json exists")
            return [], None
        return ["model.safetensors"], None
    with open(index_path) as f:
        index = json.load(f)
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        problems.append("index has no weight_map")
        return [], None
    shards = sorted(set(weight_map.values()))
    # A stray shard not named by the index would be ignored by vLLM/transformers: flag it.
    on_disk = sorted(n for n in os.listdir(root) if n.endswith(".safetensors"))
    if on_disk != shards:
        problems.append(f"shards on disk {on_disk} != shards in the index {shards}")
    return shards, index


def load_with_torch(path):
    """Raw bytes of every tensor as safetensors.torch loads it; None without torch."""
    try:
        import torch
        from safetensors.torch import load_file
    except ImportError:
        return None
    out = {}
    for name, t in load_file(path).items():
        out[name] = t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return out


def check(root):
    problems = []
    shards, index = shard_files(root, problems)
    tensors = {}  # name -> (shard, dtype, shape, bytes)
    numpy_checked = torch_checked = 0
    for shard in shards:
        path = os.path.join(root, shard)
        with open(path, "rb") as f:
            blob = f.read()
        try:
            parsed = safetensors.deserialize(blob)
        except Exception as e:  # the reference reader refused the file
            problems.append(f"{shard}: safetensors.deserialize refused it: {e}")
            continue
        handle = safe_open(path, framework="numpy")
        meta = handle.metadata() or {}
        if meta.get("format") != "pt":
            problems.append(f"{shard}: __metadata__ format is {meta.get('format')!r}, not 'pt'")
        keys = set(handle.keys())
        if keys != {name for name, _ in parsed}:
            problems.append(f"{shard}: safe_open keys differ from deserialize's")
        for name, info in parsed:
            data = bytes(info["data"])
            dtype, shape = info["dtype"], list(info["shape"])
            if name in tensors:
                problems.append(f"{name}: in {tensors[name][0]} and in {shard}")
            tensors[name] = (shard, dtype, shape, data)
            sl = handle.get_slice(name)
            if sl.get_dtype() != dtype or list(sl.get_shape()) != shape:
                problems.append(f"{shard}:{name}: get_slice says {sl.get_dtype()} {sl.get_shape()}, "
                                f"deserialize {dtype} {shape}")
            if dtype in NUMPY_DTYPES:
                arr = handle.get_tensor(name)
                if arr.dtype != NUMPY_DTYPES[dtype] or list(arr.shape) != shape:
                    problems.append(f"{shard}:{name}: numpy loads {arr.dtype} {list(arr.shape)}, "
                                    f"header says {dtype} {shape}")
                elif np.ascontiguousarray(arr).tobytes() != data:
                    problems.append(f"{shard}:{name}: numpy bytes differ from the raw bytes")
                numpy_checked += 1
        torch_bytes = load_with_torch(path)
        if torch_bytes is not None:
            for name, _ in parsed:
                if name not in torch_bytes:
                    problems.append(f"{shard}:{name}: missing from safetensors.torch.load_file")
                elif torch_bytes[name] != tensors[name][3]:
                    problems.append(f"{shard}:{name}: torch bytes differ from the raw bytes")
                else:
                    torch_checked += 1

    if index is not None:
        weight_map = index["weight_map"]
        if set(weight_map) != set(tensors):
            missing = sorted(set(tensors) - set(weight_map))[:5]
            extra = sorted(set(weight_map) - set(tensors))[:5]
            problems.append(f"index weight_map != tensors in the shards (unlisted {missing}, "
                            f"absent {extra})")
        for name, shard in weight_map.items():
            if name in tensors and tensors[name][0] != shard:
                problems.append(f"index maps {name} to {shard}, it is in {tensors[name][0]}")
        total = sum(len(t[3]) for t in tensors.values())
        declared = index.get("metadata", {}).get("total_size")
        if declared != total:
            problems.append(f"index total_size {declared} != {total} tensor bytes")

    manifest_path = os.path.join(root, "moepack.json")
    manifest_checked = 0
    if os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        recorded = manifest.get("tensors", {})
        if set(recorded) != set(tensors):
            problems.append(f"moepack.json records {len(recorded)} tensors, files hold {len(tensors)}: "
                            f"only recorded {sorted(set(recorded) - set(tensors))[:5]}, "
                            f"only in files {sorted(set(tensors) - set(recorded))[:5]}")
        for name, rec in recorded.items():
            if name not in tensors:
                continue
            shard, dtype, shape, data = tensors[name]
            want = (rec.get("shard"), rec.get("dtype"), rec.get("shape"), rec.get("bytes"))
            have = (shard, dtype, shape, len(data))
            if want != have:
                problems.append(f"{name}: moepack.json says {want}, the file has {have}")
            if rec.get("sha256") != hashlib.sha256(data).hexdigest():
                problems.append(f"{name}: SHA-256 differs from moepack.json")
            manifest_checked += 1

    config_path = os.path.join(root, "config.json")
    if not os.path.exists(config_path):
        problems.append("no config.json")
    else:
        with open(config_path) as f:
            json.load(f)

    if not tensors:
        problems.append("no tensors found")
    print(f"{root}: {len(tensors)} tensors in {len(shards)} shard(s); numpy-loaded {numpy_checked}, "
          f"torch-loaded {torch_checked if torch_checked else 'n/a (no torch)'}, "
          f"manifest-checked {manifest_checked}")
    return problems


def main(argv):
    if len(argv) < 2:
        print(f"usage: {argv[0]} CHECKPOINT_DIR...", file=sys.stderr)
        return 2
    failed = False
    for root in argv[1:]:
        problems = check(root)
        for p in problems[:50]:
            print(f"  FAIL {p}")
        if len(problems) > 50:
            print(f"  ... and {len(problems) - 50} more")
        failed |= bool(problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

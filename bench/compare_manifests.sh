#!/usr/bin/env bash
# Proves that a build changes nothing in what convert writes but the manifest keys that
# manifest_versions 2, 3 and 4 added or dropped: for every conversion bench/convert_bytes.sh makes, run
# by NEW and by BASE (a build from before, e.g. main at 173dce8),
#   - every file other than config.json and moepack.json has the same SHA-256 (tensors, index,
#     copied files), and the same conversions are refused;
#   - moepack.json is the same JSON once NEW's added keys are removed: top-level "serving" and
#     "config" (the digests of config.json's fields), each layer's "param_roles", and
#     "manifest_version" (4 in NEW, 1 in BASE), NEW's source.tensor_sha256 (the source's
#     fingerprint, version 4: present, a SHA-256 per source tensor), and BASE's source.name (the
#     last component of SRC as spelled, which version 3 dropped);
#   - config.json is the same JSON but for quantization_config.manifest_sha256, which in each is
#     the SHA-256 of its own moepack.json (checked).
# Usage: bench/compare_manifests.sh NEW_MOEPACK BASE_MOEPACK [WORKDIR]
# MOEPACK_CONVERT_FLAGS (e.g. "--vllm-target 2026-05") is passed to every convert of both.
# Prints one line per compared conversion's JSON and a summary; exit 1 on any difference.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
new=$(realpath "$1")
base=$(realpath "$2")
work=${3:-$(mktemp -d)}
mkdir -p "$work"
rm -rf "$work/new-json" "$work/base-json"
MOEPACK_KEEP_JSON="$work/new-json" bash "$here/convert_bytes.sh" "$new" "$work/new-run" >"$work/new.txt"
MOEPACK_KEEP_JSON="$work/base-json" bash "$here/convert_bytes.sh" "$base" "$work/base-run" >"$work/base.txt"

python3 - "$work" <<'PY'
import hashlib, json, os, sys

work = sys.argv[1]
ADDED_TOP = ("serving", "config")  # manifest_version 2's and 3's top-level additions
ADDED_LAYER = ("param_roles",)   # and per layer


def lines(name):
    with open(os.path.join(work, name)) as f:
        return [l.rstrip("\n") for l in f]


def is_json(line):
    return line.endswith("/moepack.json") or line.endswith("/config.json")


new, base = lines("new.txt"), lines("base.txt")
bad = 0
other_new = [l for l in new if not is_json(l)]
other_base = [l for l in base if not is_json(l)]
if other_new != other_base:
    bad += 1
    a, b = set(other_new), set(other_base)
    for l in sorted(a - b)[:20]:
        print("only in NEW: ", l)
    for l in sorted(b - a)[:20]:
        print("only in BASE:", l)
    if a == b:
        print("same lines, different order")
json_new = sorted(l.split("  ", 1)[1] for l in new if is_json(l))
json_base = sorted(l.split("  ", 1)[1] for l in base if is_json(l))
if json_new != json_base:
    bad += 1
    print("different sets of JSON files:", sorted(set(json_new) ^ set(json_base))[:20])


def load(root, rel):
    with open(os.path.join(work, root, rel), "rb") as f:
        data = f.read()
    return data, json.loads(data)


compared = 0
for rel in sorted({os.path.dirname(p) for p in json_new if p.endswith("/moepack.json")}):
    mn_bytes, mn = load("new-json", rel + "/moepack.json")
    mb_bytes, mb = load("base-json", rel + "/moepack.json")
    _, cn = load("new-json", rel + "/config.json")
    _, cb = load("base-json", rel + "/config.json")
    problems = []
    if mn.get("manifest_version") != 4 or mb.get("manifest_version") != 1:
        problems.append(f"manifest_version NEW {mn.get('manifest_version')} BASE "
                        f"{mb.get('manifest_version')} (expected 4 and 1)")
    if "name" in mn.get("source", {}):
        problems.append("NEW has source.name")
    fingerprint = mn.get("source", {}).pop("tensor_sha256", None)
    if not isinstance(fingerprint, dict) or not fingerprint or not all(
            isinstance(v, str) and len(v) == 64 for v in fingerprint.values()):
        problems.append("NEW lacks source.tensor_sha256 (a SHA-256 per source tensor)")
    mb.get("source", {}).pop("name", None)
    for k in ADDED_TOP:
        if k not in mn:
            problems.append(f"NEW lacks {k}")
        mn.pop(k, None)
    for L in mn.get("layers", []):
        for k in ADDED_LAYER:
            if k not in L:
                problems.append(f"NEW layer {L.get('module')} lacks {k}")
            L.pop(k, None)
    mn.pop("manifest_version", None)
    mb.pop("manifest_version", None)
    if mn != mb:
        keys = sorted(k for k in set(mn) | set(mb) if mn.get(k) != mb.get(k))
        problems.append(f"moepack.json differs beyond the added keys in {keys}")
    for name, cfg, data in (("NEW", cn, mn_bytes), ("BASE", cb, mb_bytes)):
        q = cfg.get("quantization_config", {})
        if q.get("manifest_sha256") != hashlib.sha256(data).hexdigest():
            problems.append(f"{name} config.json's manifest_sha256 is not its moepack.json's")
        q.pop("manifest_sha256", None)
    if cn != cb:
        problems.append("config.json differs beyond manifest_sha256")
    compared += 1
    print(("DIFF " if problems else "same ") + rel + ("" if not problems else ": " + "; ".join(problems)))
    bad += bool(problems)

print(f"{compared} conversions' JSON compared, {len(other_new)} other file hashes and refusals "
      f"compared: {'all identical but the added keys' if not bad else str(bad) + ' differences'}")
sys.exit(1 if bad or not compared else 0)
PY

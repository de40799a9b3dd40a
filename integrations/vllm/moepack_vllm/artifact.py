"""What a moepack artifact is, read from its config block and moepack.json, and how it is served.
No vLLM import here: the refusals are testable without an engine.

How each layout is served is not written here: moepack's C++ layout rows export it into
moepack.json ("serving": the path and its vLLM method/backend or kernel builder, or why not; each
layer's "param_roles"), and this module reads it (docs/vllm.md "Serving paths").

Every refusal raises ArtifactError with a message naming the file and field, so a user sees why
the artifact cannot be served instead of a model that talks nonsense.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

# The vLLM release line whose names and shapes the artifact must have been written for.
VLLM_TARGETS = ("0.33",)
# moepack.json versions this plugin reads: 2 is the first that exports "serving" and
# "param_roles" (a version 1 manifest has neither); 3 adds "config", the digests that bind
# config.json (moepack verify checks them), and drops source.name -- nothing the plugin reads.
MANIFEST_VERSIONS = (2, 3)

SERVING_PATHS = ("none", "vllm-method", "kernel-builder")


class ArtifactError(ValueError):
    """The artifact cannot be served here (wrong config, manifest, target or deployment)."""


def _field(block: dict, key: str, file: str, types):
    if key not in block:
        raise ArtifactError(f"{file}: quantization_config.{key} is missing (not a moepack block?)")
    value = block[key]
    if not isinstance(value, types) or isinstance(value, bool) and types is not bool:
        raise ArtifactError(f"{file}: quantization_config.{key}: unexpected value {value!r}")
    return value


@dataclass
class Block:
    """config.json's quantization_config of a moepack output."""

    backend: str
    layout: str
    layout_version: int
    target_arch: str
    act_dtype: str
    vllm_target: str
    tensor_parallel_size: int
    manifest: str
    manifest_sha256: str
    source_format: str
    source_quantization_config: dict | None
    expert_parallel_size: int = 1
    raw: dict = field(repr=False, default_factory=dict)

    @classmethod
    def parse(cls, block: dict, file: str = "config.json") -> "Block":
        if not isinstance(block, dict) or block.get("quant_method") != "moepack":
            raise ArtifactError(f"{file}: quantization_config.quant_method is not \"moepack\"")
        b = cls(
            backend=_field(block, "backend", file, str),
            layout=_field(block, "layout", file, str),
            layout_version=_field(block, "layout_version", file, int),
            target_arch=_field(block, "target_arch", file, str),
            act_dtype=_field(block, "act_dtype", file, str),
            # Written by every moepack that writes quant_method "moepack"; the 0.33 names are
            # the only ones such a moepack wrote before --vllm-target existed.
            vllm_target=block.get("vllm_target", "0.33"),
            tensor_parallel_size=_field(block, "tensor_parallel_size", file, int),
            # convert --expert-parallel N writes it (absent: whole experts on every rank).
            expert_parallel_size=block.get("expert_parallel_size", 1),
            manifest=_field(block, "manifest", file, str),
            manifest_sha256=_field(block, "manifest_sha256", file, str),
            source_format=_field(block, "source_format", file, str),
            source_quantization_config=block.get("source_quantization_config"),
            raw=block,
        )
        b.check_config(file)
        return b

    def check_config(self, file: str = "config.json") -> None:
        """What config.json alone shows: written for another vLLM line, dtype, digest."""
        if self.vllm_target not in VLLM_TARGETS:
            raise ArtifactError(
                f"{file}: quantization_config.vllm_target {self.vllm_target!r}: the artifact was "
                f"written for another vLLM line; this moepack-vllm serves {list(VLLM_TARGETS)} "
                "(re-convert with the matching --vllm-target)")
        if self.act_dtype not in ("BF16", "F16"):
            raise ArtifactError(f"{file}: quantization_config.act_dtype {self.act_dtype!r}")
        if len(self.manifest_sha256) != 64:
            raise ArtifactError(f"{file}: quantization_config.manifest_sha256 is not a SHA-256")
        src = self.source_quantization_config
        if src is not None and not isinstance(src, dict):
            raise ArtifactError(f"{file}: quantization_config.source_quantization_config: "
                                f"expected an object or null, got {src!r}")

    def check_deployment(self, tensor_parallel_size: int, expert_parallel: bool,
                         dtype_name: str, file: str = "config.json") -> None:
        """Refuses a deployment the artifact was not written for."""
        tp, ep = self.tensor_parallel_size, self.expert_parallel_size
        written = (f"tensor_parallel_size={tp}" if ep == 1 else
                   f"expert parallelism over {ep} ranks (--enable-expert-parallel)")
        if ep == 1 and tensor_parallel_size != tp:
            raise ArtifactError(
                f"{file}: quantization_config.tensor_parallel_size: "
                f"moepack artifact was written for tensor_parallel_size={tp}, the engine runs "
                f"{tensor_parallel_size}: each rank's expert tensors are laid out for its share "
                f"of {tp} ranks; serve it with --tensor-parallel-size {tp} or re-convert with "
                f"--tensor-parallel-size {tensor_parallel_size}")
        if bool(expert_parallel) != (ep > 1) or (ep > 1 and tensor_parallel_size != ep):
            engine = (f"expert parallelism over {tensor_parallel_size} ranks" if expert_parallel
                      else f"tensor_parallel_size={tensor_parallel_size} without expert "
                      "parallelism")
            raise ArtifactError(
                f"{file}: quantization_config.expert_parallel_size: moepack artifact was written "
                f"for {written}, the engine runs {engine}: re-convert with "
                + (f"--expert-parallel {tensor_parallel_size}" if expert_parallel
                   else f"--tensor-parallel-size {tensor_parallel_size}"))
        if tp > 1 or ep > 1:
            raise ArtifactError(
                f"{file}: quantization_config.tensor_parallel_size: moepack artifact was written "
                f"for {written}, which this engine runs; but this moepack-vllm does not load "
                "per-rank expert tensors yet (docs/vllm.md: tensor and expert parallelism)")
        want = {"BF16": "bfloat16", "F16": "float16"}[self.act_dtype]
        if dtype_name != want:
            raise ArtifactError(
                f"{file}: quantization_config.act_dtype: moepack artifact stores its scales in "
                f"{want} (act_dtype {self.act_dtype}); the "
                f"engine runs {dtype_name}: serve it with --dtype {want} or re-convert with "
                "--act-dtype")


@dataclass
class Serving:
    """moepack.json's "serving": how the layout row says this plugin serves the artifact."""

    path: str  # one of SERVING_PATHS
    vllm_method: str = ""  # vllm-method: the class of vLLM's MoE method for the source
    vllm_backend: str = ""  # vllm-method: "EnumClass.MEMBER" vLLM's oracle must pick
    kernel_builder: str = ""  # kernel-builder: the builder's name (moe.KERNEL_BUILDERS)
    reason: str = ""  # none: why not
    archs: tuple = ()  # target archs the layout's kernel runs on ("sm80", ...)

    @property
    def min_capability(self) -> int:
        """The lowest compute capability (as vLLM's to_int: 80, 100) among `archs`."""
        return min(int(a.removeprefix("sm")) for a in self.archs)


@dataclass
class Layer:
    module: str
    param_prefix: str
    experts: int
    hidden: int
    inter: int
    gated: bool
    params: dict  # local name ("w13_qweight") -> (dtype name, shape)
    roles: dict  # role ("w13_weight", "w2_scale", ...) -> local name
    index: int = 0  # its position in moepack.json's "layers"
    # What the layout decided from the layer's codes and what its kernel needs beside the
    # parameters (Humming: "w13_b_dtype"; "kernel_version", "sm_version", "w13_layer_config", ...).
    layout_decisions: dict = field(default_factory=dict)
    layout_config: dict = field(default_factory=dict)


@dataclass
class Manifest:
    path: str
    version: int
    backend: str
    layout: str
    layout_version: int
    target_arch: str
    vllm_target: str
    act_dtype: str
    source_method: str  # the experts' method (target_quant_params.method)
    bits: int
    group_size: int
    symmetric: bool
    serving: Serving
    layers: list

    def layer_for(self, prefix: str) -> Layer | None:
        """The manifest layer served by vLLM's MoE module at `prefix`.

        vLLM names the module `<module>.experts` (and its RoutedExperts child
        `<module>.experts.routed_experts`); the manifest names the source's MoE block."""
        for L in self.layers:
            if prefix == L.module + ".experts" or prefix.startswith(L.module + ".experts."):
                return L
        return None

    def check_matches(self, block: Block, file: str = "config.json") -> None:
        """config.json's block repeats what the manifest says; both come from one conversion."""
        for key, mine in (("backend", self.backend), ("layout", self.layout),
                          ("layout_version", self.layout_version),
                          ("target_arch", self.target_arch), ("vllm_target", self.vllm_target),
                          ("act_dtype", self.act_dtype)):
            theirs = getattr(block, key)
            if theirs != mine:
                where = "layout.version" if key == "layout_version" else key
                raise ArtifactError(
                    f"{file}: quantization_config.{key} {theirs!r} differs from {self.path}'s "
                    f"{where} {mine!r}: the config and the manifest do not describe the same "
                    "conversion")

    def check_servable(self, kernel_builders, source_config_present: bool) -> None:
        """Refuses what the layout row says is not served, or a path this plugin lacks."""
        s = self.serving
        if s.path == "none":
            raise ArtifactError(
                f"{self.path}: serving.path \"none\": backend {self.backend!r} is not served by "
                f"moepack-vllm for vLLM {self.vllm_target} ({self.source_method} experts): "
                f"{s.reason}")
        if s.path == "kernel-builder" and s.kernel_builder not in kernel_builders:
            raise ArtifactError(
                f"{self.path}: serving.kernel_builder {s.kernel_builder!r}: this moepack-vllm has "
                f"the kernel builders {sorted(kernel_builders)}; upgrade moepack-vllm")
        if s.path == "vllm-method" and not source_config_present:
            raise ArtifactError(
                f"{self.path}: serving.path \"vllm-method\" needs vLLM's method for the source, "
                "but config.json's quantization_config.source_quantization_config is null")


def _serving(s: dict) -> Serving:
    if not isinstance(s, dict):
        raise TypeError(f"serving: expected an object, got {s!r}")
    path = s["path"]
    if path not in SERVING_PATHS:
        raise ValueError(f"serving.path {path!r} (expected one of {list(SERVING_PATHS)})")
    out = Serving(path=path, archs=tuple(s["archs"]))
    if not out.archs or not all(isinstance(a, str) and a.startswith("sm") for a in out.archs):
        raise ValueError(f"serving.archs {s['archs']!r}")
    if path == "vllm-method":
        out.vllm_method, out.vllm_backend = str(s["vllm_method"]), str(s["vllm_backend"])
        if out.vllm_backend.count(".") != 1:
            raise ValueError(f"serving.vllm_backend {out.vllm_backend!r} is not EnumClass.MEMBER")
    elif path == "kernel-builder":
        out.kernel_builder = str(s["kernel_builder"])
    else:
        out.reason = str(s["reason"])
    return out


def _layer(i: int, L: dict, tensors: dict, path: str) -> Layer:
    prefix = L["param_prefix"]
    params, roles = {}, {}
    for name in L["params"]:
        t = tensors[name]
        if not name.startswith(prefix):
            raise ArtifactError(f"{path}: layers[{i}].params: {name} is not under {prefix}")
        params[name[len(prefix):]] = (t["dtype"], tuple(t["shape"]))
    for name, role in L["param_roles"].items():
        if name not in L["params"]:
            raise ArtifactError(f"{path}: layers[{i}].param_roles: {name} is not in its params")
        if role in roles:
            raise ArtifactError(f"{path}: layers[{i}].param_roles: two parameters are {role}")
        roles[role] = name[len(prefix):]
    missing = set(L["params"]) - set(L["param_roles"])
    if missing:
        raise ArtifactError(f"{path}: layers[{i}].param_roles: no role for {sorted(missing)}")
    extra = {}
    for key in ("layout_decisions", "layout_config"):
        value = L.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ArtifactError(f"{path}: layers[{i}].{key}: expected an object of strings")
        extra[key] = value
    return Layer(L["module"], prefix, L["experts"], L["hidden"], L["inter"], L["gated"], params,
                 roles, i, **extra)


def read_manifest(model_dir: str, block: Block) -> Manifest:
    """Reads DIR/moepack.json, checking it is the one config.json names (by SHA-256) and that
    both describe the same conversion."""
    path = os.path.join(model_dir, block.manifest)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read the moepack manifest: {e}") from e
    digest = hashlib.sha256(data).hexdigest()
    if digest != block.manifest_sha256:
        raise ArtifactError(
            f"{path}: SHA-256 {digest} differs from config.json's "
            f"quantization_config.manifest_sha256 {block.manifest_sha256}: the manifest and the "
            "config are not from the same conversion")
    try:
        m = json.loads(data)
        version = m["manifest_version"]
        if version not in MANIFEST_VERSIONS:
            raise ArtifactError(
                f"{path}: manifest_version {version!r}: this moepack-vllm reads "
                f"{list(MANIFEST_VERSIONS)} (version 1 predates the exported serving paths and "
                "parameter roles): re-convert with a newer moepack")
        tq = m["target_quant_params"]
        layers = [_layer(i, L, m["tensors"], path) for i, L in enumerate(m["layers"])]
        out = Manifest(path, version, m["backend"], m["layout"]["name"], m["layout"]["version"],
                       m["target_arch"], m["vllm_target"], m["act_dtype"], tq["method"],
                       tq["bits"], tq["group_size"], tq["symmetric"], _serving(m["serving"]),
                       layers)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        if isinstance(e, ArtifactError):
            raise
        raise ArtifactError(f"{path}: malformed moepack manifest ({e!r})") from e
    out.check_matches(block)
    return out


def check_capability(manifest: Manifest, device_capability: int | None) -> None:
    """Refuses a GPU below every arch the layout's kernel runs on (serving.archs)."""
    if device_capability is None:
        return
    need = manifest.serving.min_capability
    if device_capability < need:
        raise ArtifactError(
            f"{manifest.path}: serving.archs {list(manifest.serving.archs)}: moepack "
            f"{manifest.backend} artifact (target {manifest.target_arch}) needs an sm{need}+ "
            f"GPU; this one is sm{device_capability}")

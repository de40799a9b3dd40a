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
# config.json (moepack verify checks them), and drops source.name -- nothing the plugin reads;
# 4 adds source.tensor_sha256, the source's fingerprint (merge and verify --source check it).
MANIFEST_VERSIONS = (2, 3, 4)

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
    expert_placement: str = ""  # "linear" / "round_robin" (expert-parallel artifacts)
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
            expert_placement=block.get("expert_placement", ""),
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

    @property
    def is_parallel(self) -> bool:
        """Written for tensor or expert parallelism (per-rank expert tensors)."""
        return self.tensor_parallel_size > 1 or self.expert_parallel_size > 1

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
    family: str = ""  # moepack.json's layer "family" ("gpt-oss", "per-expert", ...)
    inter_padded: int = 0  # the I the parameters carry (moepack.json "inter_padded"; >= inter;
    #                        a parallel artifact's rank: its inter)
    # What the layout decided from the layer's codes and what its kernel needs beside the
    # parameters (Humming: "w13_b_dtype"; "kernel_version", "sm_version", "w13_layer_config", ...).
    layout_decisions: dict = field(default_factory=dict)
    layout_config: dict = field(default_factory=dict)
    # Where those two are in moepack.json: "layers[i]", or "layers[i].ranks[r]" for a rank of a
    # parallel artifact.
    record: str = ""


def rank_dir_name(rank: int, ranks: int) -> str:
    """The directory of a rank's tensors in a parallel artifact ("rank03-of-08"), as moepack's
    rank_dir_name (formats/parallel.cpp) writes it: at least two digits, as many as `ranks` has."""
    width = max(2, len(str(ranks)))
    return f"rank{rank:0{width}d}-of-{ranks:0{width}d}"


def rank_of_tensor(name: str) -> int | None:
    """The rank a checkpoint tensor name "rankRR-of-NN/..." belongs to, None for a tensor every
    rank reads."""
    head, sep, _ = name.partition("/")
    if not sep or not head.startswith("rank") or "-of-" not in head:
        return None
    r, _, n = head[4:].partition("-of-")
    if not (r.isdigit() and n.isdigit()) or head != rank_dir_name(int(r), int(n)):
        return None
    return int(r)


@dataclass
class RankShare:
    """One rank of a parallel artifact (moepack.json "parallel.ranks[r]")."""

    shards: tuple  # the files holding its expert tensors (and nothing else)
    experts: tuple  # expert parallel: its experts' global ids in local order; () otherwise


@dataclass
class Parallel:
    """moepack.json's "parallel": the deployment the expert tensors are sharded for."""

    tensor: int
    expert: int
    placement: str  # expert parallel: "linear" / "round_robin"
    ranks: list  # RankShare per rank

    @property
    def size(self) -> int:
        return max(self.tensor, self.expert)

    def describe(self) -> str:
        if self.expert > 1:
            return f"expert parallelism over {self.expert} ranks ({self.placement} placement)"
        return f"tensor_parallel_size={self.tensor}"


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
    parallel: Parallel | None = None
    rank: int | None = None  # for_rank's: the rank whose tensors `layers` describe
    raw_layers: list = field(repr=False, default_factory=list)  # moepack.json's, for for_rank
    raw_tensors: dict = field(repr=False, default_factory=dict)

    def for_rank(self, rank: int) -> "Manifest":
        """A parallel artifact as rank `rank` serves it: each layer's parameters are that rank's
        ("rankRR-of-NN/<name>" in moepack.json, its own files), under the layout's names, with
        the rank's expert count (expert parallel) and intermediate size (tensor parallel)."""
        import dataclasses

        p = self.parallel
        if p is None or not 0 <= rank < p.size:
            raise ArtifactError(f"{self.path}: no rank {rank} in this artifact")
        layers = [_layer(i, L, self.raw_tensors, self.path, rank=rank, parallel=p)
                  for i, L in enumerate(self.raw_layers)]
        return dataclasses.replace(self, layers=layers, rank=rank)

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


def _layer(i: int, L: dict, tensors: dict, path: str, rank: int | None = None,
           parallel: Parallel | None = None) -> Layer:
    prefix = L["param_prefix"]
    experts, inter = L["experts"], L["inter"]
    # A parallel artifact lists every rank's parameters, "rankRR-of-NN/<prefix><local>": a rank
    # serves its own, named as the layout names them. The layer's whole-layer sizes become the
    # rank's (vLLM's local_num_experts and intermediate_size_per_partition).
    mine = "" if parallel is None else rank_dir_name(rank or 0, parallel.size) + "/"
    names = [n for n in L["params"] if n.startswith(mine)] if mine else list(L["params"])
    if parallel is not None:
        inter //= parallel.tensor
        if parallel.expert > 1:
            experts = len(parallel.ranks[rank or 0].experts)
    params, roles = {}, {}
    for name in names:
        t = tensors[name]
        local_name = name[len(mine):]
        if not local_name.startswith(prefix):
            raise ArtifactError(f"{path}: layers[{i}].params: {name} is not under {mine}{prefix}")
        params[local_name[len(prefix):]] = (t["dtype"], tuple(t["shape"]))
    for name, role in L["param_roles"].items():
        if name not in L["params"]:
            raise ArtifactError(f"{path}: layers[{i}].param_roles: {name} is not in its params")
        if mine and not name.startswith(mine):
            continue
        if role in roles:
            raise ArtifactError(f"{path}: layers[{i}].param_roles: two parameters are {role}")
        roles[role] = name[len(mine) + len(prefix):]
    missing = set(L["params"]) - set(L["param_roles"])
    if missing:
        raise ArtifactError(f"{path}: layers[{i}].param_roles: no role for {sorted(missing)}")
    if parallel is not None and not params:
        raise ArtifactError(f"{path}: layers[{i}].params: none of {mine}")
    # The layout's decisions and its runtime configuration (Humming's LayerConfig strings): the
    # layer's, or in a parallel artifact the rank's own ("ranks"[r]: each rank decided on its
    # share of the layer and is configured for its shape, as vLLM 0.33 post-processes each
    # rank's slice alone).
    record, where = L, f"layers[{i}]"
    if parallel is not None and "ranks" in L:
        recs = L["ranks"]
        if not isinstance(recs, list) or len(recs) != parallel.size:
            raise ArtifactError(f"{path}: layers[{i}].ranks: expected one entry per rank "
                                f"({parallel.size})")
        record, where = recs[rank or 0], f"layers[{i}].ranks[{rank or 0}]"
        if not isinstance(record, dict) or record.get("rank") != (rank or 0):
            raise ArtifactError(f"{path}: {where}.rank: expected {rank or 0}")
    extra = {}
    for key in ("layout_decisions", "layout_config"):
        value = record.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise ArtifactError(f"{path}: {where}.{key}: expected an object of strings")
        extra[key] = value
    # Read for whole artifacts (the gpt-oss builder's check; gpt-oss is never written parallel).
    inter_padded = inter if parallel is not None else int(L.get("inter_padded", inter))
    return Layer(L["module"], prefix, experts, L["hidden"], inter, L["gated"], params, roles, i,
                 family=str(L.get("family", "")), inter_padded=inter_padded, record=where, **extra)


def _parallel(p: dict, block: Block, path: str) -> Parallel:
    """moepack.json's "parallel", which must say what config.json's block says."""
    out = Parallel(int(p["tensor_parallel_size"]), int(p["expert_parallel_size"]),
                   str(p.get("expert_placement", "")), [])
    for i, r in enumerate(p["ranks"]):
        if r["rank"] != i:
            raise ValueError(f"parallel.ranks[{i}].rank {r['rank']!r}")
        out.ranks.append(RankShare(tuple(r["shards"]), tuple(int(e) for e in r.get("experts", ()))))
    if len(out.ranks) != out.size:
        raise ValueError(f"parallel.ranks: {len(out.ranks)} entries for {out.size} ranks")
    if (out.tensor, out.expert) != (block.tensor_parallel_size, block.expert_parallel_size) or (
            out.expert > 1 and out.placement != block.expert_placement):
        raise ArtifactError(
            f"{path}: parallel ({out.describe()}) differs from config.json's quantization_config "
            f"(tensor_parallel_size={block.tensor_parallel_size}, expert_parallel_size="
            f"{block.expert_parallel_size}, expert_placement={block.expert_placement!r}): the "
            "config and the manifest do not describe the same conversion")
    return out


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
        parallel = _parallel(m["parallel"], block, path) if "parallel" in m else None
        if parallel is None and block.is_parallel:
            raise ArtifactError(
                f"{path}: no \"parallel\", but config.json's quantization_config says "
                f"tensor_parallel_size={block.tensor_parallel_size}, expert_parallel_size="
                f"{block.expert_parallel_size}: the config and the manifest do not describe the "
                "same conversion")
        # Rank 0's layers stand for the artifact until a rank is known (for_rank).
        layers = [_layer(i, L, m["tensors"], path, rank=0 if parallel else None,
                         parallel=parallel) for i, L in enumerate(m["layers"])]
        out = Manifest(path, version, m["backend"], m["layout"]["name"], m["layout"]["version"],
                       m["target_arch"], m["vllm_target"], m["act_dtype"], tq["method"],
                       tq["bits"], tq["group_size"], tq["symmetric"], _serving(m["serving"]),
                       layers, parallel, None, m["layers"], m["tensors"])
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

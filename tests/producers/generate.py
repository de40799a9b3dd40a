#!/usr/bin/env python3
"""Regenerates tests/producers/fixtures/: checkpoints written by the real producers.

Run in a test-only virtual environment holding the producers (CPU is enough; see
tests/producers/README.md for the exact versions and the install line):

    /work/venv-producers/bin/python tests/producers/generate.py [NAME ...]

Each fixture is written as fixtures/NAME/{ckpt/, dequant.safetensors, producer.json}:
  ckpt/               the checkpoint exactly as the producer saved it (config.json, weights and
                      the producer's side files; tokenizer files dropped)
  dequant.safetensors the producer's own dequantization of every routed expert Linear, computed
                      here with the producer's code (compressed-tensors' compressor.decompress,
                      auto-round's QuantLinear / dequantize_gemm, ...), keyed by module name,
                      [N, K] in the dtype the producer dequantizes into
  producer.json       producer, versions, scheme, and what moepack must do with it

The tiny models are built from configs with random weights (no hub download) and a word-level
tokenizer made here. Nothing here runs at build or test time: the ctest reads the committed
files only.
"""
import importlib.metadata as md
import json
import os
import re
import shutil
import sys
import tempfile
import traceback

import torch
from safetensors import safe_open
from safetensors.torch import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def version(pkg):
    try:
        return md.version(pkg)
    except md.PackageNotFoundError:
        return None


# ---------------------------------------------------------------------------- tiny models

def make_tokenizer(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(124)}
    vocab.update({"<unk>": 124, "<s>": 125, "</s>": 126, "<pad>": 127})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                            eos_token="</s>", pad_token="<pad>").save_pretrained(path)


# The families of issue 30, each a tiny config of its own model type (4 experts, top-2 unless
# the family routes otherwise). Absent from a transformers version: skipped with a message.
def family_config(family, common, inter=128):
    """inter: the experts' intermediate size (and the dense MLPs') of the families whose
    first fixtures used 128; 64 (Marlin's least) for the rows added later, which keeps each
    fixture near 400 KB. glm4_moe_lite with common's num_hidden_layers = 2 gets a dense layer
    0 and a sparse layer 1 (auto-round keeps layer 0's MLP in 16 bits, below)."""
    import transformers as tf

    e4 = dict(intermediate_size=inter)
    glm_layers = ["dense"] * (common["num_hidden_layers"] - 1) + ["sparse"]
    # GLM-4.7-Flash's MLA at DeepSeek-V3.2's sizes below for the rows added later (its defaults,
    # q_lora_rank 768 and kv_lora_rank 512, make a 1.5 MB checkpoint); the llm-compressor row
    # keeps the defaults it was made with.
    glm_mla = {} if inter == 128 else dict(q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
                                           qk_rope_head_dim=16, v_head_dim=32)
    table = {
        "olmoe": lambda: tf.OlmoeConfig(num_experts=4, **e4, **common),
        "phimoe": lambda: tf.PhimoeConfig(num_local_experts=4, **e4, **common),
        "granitemoe": lambda: tf.GraniteMoeConfig(num_local_experts=4, **e4, **common),
        # Granite MoE with a shared expert (shared_mlp.input_linear / output_linear beside the
        # routed experts).
        "granitemoeshared": lambda: tf.GraniteMoeSharedConfig(
            num_local_experts=4, shared_intermediate_size=inter, **e4, **common),
        "minimax_m2": lambda: tf.MiniMaxM2Config(num_local_experts=4, **e4, **common),
        "ernie4_5_moe": lambda: tf.Ernie4_5_MoeConfig(
            moe_num_experts=4, moe_intermediate_size=inter, moe_layer_start_index=0, **e4,
            **{k: v for k, v in common.items() if k != "num_experts_per_tok"}, moe_k=2),
        "glm4_moe_lite": lambda: tf.Glm4MoeLiteConfig(
            n_routed_experts=4, moe_intermediate_size=inter, mlp_layer_types=glm_layers, **e4,
            **glm_mla, **common),
        # Mistral-4's own YaRN rope needs the rope head = head_dim (64 here): with a narrower
        # one its frequency tables come out of different lengths (11 and 10), and transformers'
        # generic rope init, which auto-round 0.15.1 patches, computes them from head_dim.
        "mistral4": lambda: tf.Mistral4Config(
            n_routed_experts=4, moe_intermediate_size=64, intermediate_size=64, q_lora_rank=64,
            kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=64, v_head_dim=32, **common),
        "deepseek_v32": lambda: tf.DeepseekV32Config(
            n_routed_experts=4, moe_intermediate_size=inter, first_k_dense_replace=0, n_group=1,
            topk_group=1, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
            qk_rope_head_dim=16, v_head_dim=32, index_head_dim=32, index_n_heads=2, **e4,
            **common),
        # The families added last: I = 64 (the least Marlin's I % 64 rule allows), so that each
        # fixture stays near 400 KB.
        "gemma4_text": lambda: tf.Gemma4TextConfig(
            num_experts=4, top_k_experts=2, enable_moe_block=True, moe_intermediate_size=64,
            intermediate_size=64, global_head_dim=64, hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=128,
            **{k: v for k, v in common.items() if k != "num_experts_per_tok"}),
        "llama4_text": lambda: tf.Llama4TextConfig(
            num_local_experts=4, intermediate_size=64, intermediate_size_mlp=64,
            **{**common, "num_experts_per_tok": 1}),
        # Llama-4 as released: Llama4ForConditionalGeneration (model_type llama4, the MoE fields
        # under text_config) with a vision tower, here of one tiny layer.
        "llama4": lambda: tf.Llama4Config(
            text_config=dict(num_local_experts=4, intermediate_size=64, intermediate_size_mlp=64,
                             **{**common, "num_experts_per_tok": 1}),
            vision_config=dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=16, vision_output_dim=16, image_size=28,
                               patch_size=14, projector_input_dim=16, projector_output_dim=16),
            boi_token_index=120, eoi_token_index=121, image_token_index=122),
    }
    return table[family]()


def causal_lm(family):
    """The class that loads the family. transformers (5.17 to 5.20 at least) has
    Mistral4ForCausalLM but no AutoModelForCausalLM row for Mistral4Config (and register() skips
    transformers' own configs): the class itself for that family."""
    from transformers import AutoModelForCausalLM

    if family == "mistral4":
        from transformers.models.mistral4.modeling_mistral4 import Mistral4ForCausalLM
        return Mistral4ForCausalLM
    if family == "llama4":
        from transformers import Llama4ForConditionalGeneration
        return Llama4ForConditionalGeneration
    return AutoModelForCausalLM


def base_model(family, work, inter=128, layers=1, kv_heads=1):
    """A tiny random model saved to work/base-FAMILY[-iINTER-lLAYERS-kvKV]; returns its path.
    inter and layers apply to the families of issue 30 (family_config)."""
    from transformers import AutoModelForCausalLM, MixtralConfig, Qwen3MoeConfig

    suffix = "" if (inter, layers, kv_heads) == (128, 1, 1) else \
        f"-i{inter}-l{layers}" + ("" if kv_heads == 1 else f"-kv{kv_heads}")
    path = os.path.join(work, "base-" + family + suffix)
    if os.path.exists(path):
        return path
    torch.manual_seed({"qwen3": 1, "mixtral": 2}.get(family, sum(map(ord, family))))
    common = dict(vocab_size=128, hidden_size=128, num_hidden_layers=layers,
                  num_attention_heads=2, num_key_value_heads=kv_heads, head_dim=64, num_experts_per_tok=2,
                  max_position_embeddings=64, tie_word_embeddings=False)
    if family == "qwen3":
        cfg = Qwen3MoeConfig(intermediate_size=256, moe_intermediate_size=128, num_experts=4,
                             norm_topk_prob=True, **common)
    elif family == "mixtral":
        cfg = MixtralConfig(intermediate_size=128, num_local_experts=4, **common)
    else:
        cfg = family_config(family, common, inter)
    cls = causal_lm(family)
    # AutoModelForCausalLM.from_config is the model class's _from_config.
    model = (cls.from_config if cls is AutoModelForCausalLM else cls._from_config)(
        cfg, dtype=torch.bfloat16)
    model.save_pretrained(path)
    make_tokenizer(path)
    return path


def find_saved(out):
    """The folder holding config.json under `out` (auto-round nests one)."""
    for root, _, files in os.walk(out):
        if "config.json" in files:
            return root
    raise RuntimeError("no config.json under " + out)


def read_tensors(ckpt):
    tensors = {}
    for fn in sorted(os.listdir(ckpt)):
        if fn.endswith(".safetensors"):
            with safe_open(os.path.join(ckpt, fn), "pt") as f:
                for k in f.keys():
                    tensors[k] = f.get_tensor(k)
    return tensors


EXPERT_RE = re.compile(r"^(.*\.experts\.\d+\.(?:gate_proj|up_proj|down_proj|w1|w2|w3))\.(\w+)$")


def expert_modules(tensors):
    mods = {}
    for k, t in tensors.items():
        m = EXPERT_RE.match(k)
        if m:
            mods.setdefault(m.group(1), {})[m.group(2)] = t
    return dict(sorted(mods.items()))


def quant_config(ckpt):
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg.get("quantization_config")
    if qc is None:
        for side in ("quantization_config.json", "quantize_config.json"):
            p = os.path.join(ckpt, side)
            if os.path.exists(p):
                with open(p) as f:
                    qc = json.load(f)
    return qc


# ---------------------------------------------------------------------------- dequantization

def dequant_compressed_tensors(ckpt):
    """compressed-tensors' own decompression of every expert Linear: the scheme its own
    match_targets resolves for the module, and that format's compressor.decompress."""
    from compressed_tensors.compressors.base import BaseCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from compressed_tensors.utils.match import match_targets

    qc = QuantizationConfig.model_validate(quant_config(ckpt))
    target_to_group = {}
    for gname, scheme in qc.config_groups.items():
        for t in scheme.targets:
            target_to_group[t] = scheme
    out = {}
    probe = torch.nn.Linear(1, 1)
    for module, local in expert_modules(read_tensors(ckpt)).items():
        matched = match_targets(module, probe, list(target_to_group))
        assert matched, module
        scheme = target_to_group[matched[0]]
        fmt = scheme.format or qc.format
        compressor = BaseCompressor.load_from_registry(fmt)
        state = compressor.decompress(dict(local), scheme)
        out[module] = state["weight"].contiguous()
    return out


def dequant_auto_round_gptq(ckpt, bits, group_size, zp_class):
    """auto-round's own reader of its auto_gptq packing: its torch QuantLinear applied to the
    identity (x @ W^T with x = I gives W^T exactly: one product per output, no sums of
    non-zeros)."""
    if zp_class:
        from auto_round_extension.torch.qlinear_torch_zp import QuantLinear
    else:
        from auto_round_extension.torch.qlinear_torch import QuantLinear
    out = {}
    for module, local in expert_modules(read_tensors(ckpt)).items():
        k = local["qweight"].shape[0] * 32 // bits
        n = local["qweight"].shape[1]
        q = QuantLinear(bits, group_size, k, n, bias=False)
        q.qweight = local["qweight"]
        q.qzeros = local["qzeros"]
        q.scales = local["scales"]
        if "g_idx" in local:
            q.g_idx = local["g_idx"]
        q.post_init()
        eye = torch.eye(k, dtype=local["scales"].dtype)
        out[module] = q(eye).t().contiguous()
    return out


def dequant_auto_round_awq(ckpt, bits, group_size):
    """auto-round's own AWQ GEMM dequantization (export_to_awq.utils.dequantize_gemm)."""
    from auto_round.export.export_to_awq.utils import dequantize_gemm

    out = {}
    for module, local in expert_modules(read_tensors(ckpt)).items():
        w = dequantize_gemm(local["qweight"], local["qzeros"], local["scales"], bits, group_size)
        out[module] = w.t().contiguous()  # [K, N] -> [N, K]
    return out


def dequant_modelopt_mxfp8(ckpt):
    """ModelOpt's own MXFP8 dequantization (MXFP8QTensor.dequantize) into float32."""
    from modelopt.torch.quantization.qtensor.mxfp8_tensor import MXFP8QTensor

    out = {}
    for module, local in expert_modules(read_tensors(ckpt)).items():
        w = local["weight"]
        q = MXFP8QTensor(w.shape, torch.float32, w)
        out[module] = q.dequantize(dtype=torch.float32, scale=local["weight_scale"]).contiguous()
    return out


def dequant_modelopt_nvfp4(ckpt):
    """ModelOpt's own NVFP4 dequantization (NVFP4QTensor.dequantize, its torch path: f32 block
    scale times weight_scale_2, times the e2m1 value) into float32."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    out = {}
    for module, local in expert_modules(read_tensors(ckpt)).items():
        w = local["weight"]
        n, half_k = w.shape
        q = NVFP4QTensor(torch.Size([n, 2 * half_k]), torch.float32, w)
        out[module] = q.dequantize(dtype=torch.float32, scale=local["weight_scale"],
                                   double_scale=local["weight_scale_2"],
                                   block_sizes={-1: 16}).contiguous()
    return out


def dequant_gptqmodel(out):
    """GPTQModel's own reader: the saved checkpoint loaded with GPTQModel (torch kernel, which
    converts v1 zeros to v2 as GPTQModel does on load), each expert Linear applied to the
    identity."""
    from gptqmodel import BACKEND, GPTQModel

    # float16, the dtype of GPTQ scales on disk: in bf16 GPTQModel would round the scales first.
    model = GPTQModel.load(out, device="cpu", backend=BACKEND.TORCH, dtype=torch.float16)
    res = {}
    for name, mod in model.model.named_modules():
        if EXPERT_RE.match(name + ".qweight") and hasattr(mod, "qweight"):
            k = mod.in_features
            eye = torch.eye(k, dtype=mod.scales.dtype)
            with torch.no_grad():
                res[name] = mod(eye).t().contiguous()
    return dict(sorted(res.items()))


# ---------------------------------------------------------------------------- producers

def llmcompressor_fixture(family, recipe, work, name, shape=None):
    from llmcompressor import oneshot

    base = base_model(family, work, **(shape or {}))
    model = causal_lm(family).from_pretrained(base, dtype=torch.bfloat16)
    oneshot(model=model, recipe=recipe)
    out = os.path.join(work, name)
    model.save_pretrained(out, save_compressed=True)
    return out, dequant_compressed_tensors(out)


def ct_scheme(bits, group_size, symmetric, targets, strategy="group"):
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    return QuantizationScheme(
        targets=targets,
        weights=QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric,
                                 strategy=strategy,
                                 group_size=group_size if strategy == "group" else None))


# Routers by every name the families give them (block_sparse_moe.gate, router, router.layer, ...).
ROUTER_IGNORE = ["lm_head", r"re:.*\.gate$", r"re:.*\.router(\.layer|\.proj)?$"]
# Multimodal wrappers (Llama-4): the vision tower and its projector stay unquantized.
VISION_IGNORE = [r"re:.*vision_model\..*", r"re:.*multi_modal_projector\..*"]


def ct_modifier(config_groups=None, scheme=None, ignore=None):
    from llmcompressor.modifiers.quantization import QuantizationModifier

    ignore = ignore or ["lm_head", "re:.*mlp.gate$"]
    if scheme is not None:
        return QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore)
    return QuantizationModifier(config_groups=config_groups, ignore=ignore)


def auto_round_fixture(family, fmt, bits, group_size, sym, work, name, shape=None):
    from auto_round import AutoRound
    from transformers import AutoTokenizer

    base = base_model(family, work, **(shape or {}))
    model = causal_lm(family).from_pretrained(base, dtype=torch.bfloat16)
    tok = AutoTokenizer.from_pretrained(base)
    ar = AutoRound(model, tokenizer=tok, bits=bits, group_size=group_size, sym=sym, iters=0,
                   disable_opt_rtn=True)
    out = os.path.join(work, name)
    ar.quantize_and_save(out, format=fmt)
    saved = find_saved(out)
    qc = quant_config(saved)
    packing = qc.get("packing_format", qc.get("quant_method"))
    if "awq" in packing:
        return saved, dequant_auto_round_awq(saved, bits, group_size)
    return saved, dequant_auto_round_gptq(saved, bits, group_size, zp_class=True)


def modelopt_fixture(family, cfg_name, work, name, dequant=None):
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    base = base_model(family, work)
    model = causal_lm(family).from_pretrained(base, dtype=torch.bfloat16)
    torch.manual_seed(0)
    ids = torch.randint(0, 120, (2, 16))
    mtq.quantize(model, getattr(mtq, cfg_name), forward_loop=lambda m: m(ids))
    out = os.path.join(work, name)
    export_hf_checkpoint(model, export_dir=out)
    return out, (dequant or dequant_modelopt_mxfp8)(out)


def gptqmodel_fixture(family, bits, group_size, sym, desc_act, fmt, dynamic, zero_rows,
                      work, name, shape=None):
    """GPTQModel on the CPU with a small random calibration set. zero_rows: make the first rows
    of expert 0's gate projection non-negative, so their groups get a zero point of 0 (the v1
    borrow case)."""
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQModel, QuantizeConfig

    base = base_model(family, work, **(shape or {}))
    if zero_rows:
        model = causal_lm(family).from_pretrained(base, dtype=torch.bfloat16)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n.endswith("experts.gate_up_proj"):
                    p[0, :zero_rows, :] = p[0, :zero_rows, :].abs() + 1e-3
        base = os.path.join(work, f"base-{family}-zero-rows")
        model.save_pretrained(base)
        make_tokenizer(base)
    qcfg = QuantizeConfig(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act,
                          format=fmt, dynamic=dynamic)
    model = GPTQModel.load(base, qcfg, device="cpu")
    torch.manual_seed(0)
    calib = [{"input_ids": torch.randint(0, 120, (1, 32)),
              "attention_mask": torch.ones(1, 32, dtype=torch.long)} for _ in range(16)]
    model.quantize(calib, batch_size=1)
    out = os.path.join(work, name)
    model.save(out)
    return out, dequant_gptqmodel(out)


# The families of issue 30 (llama4: the released multimodal wrapper; llama4_text: the bare text
# model, which llm-compressor 0.14 cannot linearize).
NEW_FAMILIES = ("olmoe", "phimoe", "granitemoe", "granitemoeshared", "minimax_m2", "ernie4_5_moe",
                "glm4_moe_lite", "mistral4", "deepseek_v32", "gemma4_text", "llama4_text", "llama4")

# Families added after the llm-compressor rows were made: those rows take small_shape too.
LATE_FAMILIES = ("granitemoeshared",)

# The shape of the families' auto-round and GPTQModel rows (added after the llm-compressor
# ones, which keep the I = 128 they were made with): experts of I = 64, Marlin's least, so that
# each fixture stays near 400 KB; GLM-4.7-Flash with a dense layer 0 before its sparse layer 1,
# since auto-round keeps every layer below first_k_dense_replace (default 1) in 16 bits.
def small_shape(family):
    return dict(inter=64, layers=2 if family == "glm4_moe_lite" else 1)


# GPTQModel 7.7 needs transformers >= 5.20.2, whose multi-head latent attention (GLM-4.7-Flash,
# DeepSeek-V3.2, Mistral-4) fails with fewer KV heads than heads, as the rows above have ("The
# size of tensor a (2) must match the size of tensor b (4) at non-singleton dimension 1" in
# sdpa_attention_forward; transformers 5.17 runs it): its rows give those families 2 of 2.
def gptqmodel_shape(family):
    mla = family in ("glm4_moe_lite", "deepseek_v32", "mistral4")
    return dict(small_shape(family), kv_heads=2 if mla else 1)


# Rows run only when named: their output is not committed (docs/producers.md says what each
# gave). ct-nvfp4-qwen3 and ct-w4a16-g32-llama4_text: llm-compressor fails on them here.
# GPTQModel 7.7.0 (transformers 5.23, defuser 0.0.28) stops on ernie4_5_moe, glm4_moe_lite,
# mistral4, llama4 and llama4_text.
NOT_COMMITTED = {"ct-nvfp4-qwen3", "ct-w4a16-g32-llama4_text"}
NOT_COMMITTED |= {"gptqmodel-v1-sym-" + f for f in
                  ("ernie4_5_moe", "glm4_moe_lite", "mistral4", "llama4", "llama4_text")}

# Rows whose producer leaves every expert unquantized under a config declaring them quantized
# (its own dequantization finds no packed expert): moepack refuses to read the experts, exit 4
# naming the tensor. auto-round on llama4_text and GPTQModel on gemma4_text keep the fused 3-D experts
# in BF16; GPTQModel's module trees for granitemoe(shared) and minimax_m2 name no expert Linear
# that transformers 5.23 has, so it saves their BF16 'weight's.
UNQUANTIZED_EXPERTS = {
    "autoround-native-sym-llama4_text": "fused 3-D BF16 tensors, not quantized",
    "gptqmodel-v1-sym-gemma4_text": "fused 3-D BF16 tensors, not quantized",
    "gptqmodel-v1-sym-granitemoe": "BF16 'weight' tensors, not quantized",
    "gptqmodel-v1-sym-granitemoeshared": "BF16 'weight' tensors, not quantized",
    "gptqmodel-v1-sym-minimax_m2": "BF16 'weight' tensors, not quantized",
}


# What verify must name for each family: its router row (the model type moepack keys it on;
# Llama-4's wrapper is routed by its text model's row) and the experts' activation.
def family_verify(family):
    router = {"llama4": "llama4_text"}.get(family, family)
    return {"router": router, "activation": "gelu_tanh" if family == "gemma4_text" else "silu"}


CT = "llm-compressor"
GM = "gptqmodel"
MO = "modelopt"
AR = "auto-round"


def fixtures():
    """name -> (producer, family, scheme text, builder(work) -> (ckpt, dequant), convert/refuse)."""
    sm90 = lambda *b: [{"backend": x, "target_arch": "sm90"} for x in b]
    sm100 = lambda *b: [{"backend": x, "target_arch": "sm100"} for x in b]
    f = {}
    f["ct-w4a16-g32-qwen3"] = (
        CT, "qwen3", "W4A16 symmetric, group 32",
        lambda w, n: llmcompressor_fixture(
            "qwen3", ct_modifier({"group_0": ct_scheme(4, 32, True, ["Linear"])}), w, n),
        {"method": "compressed-tensors-pack-quantized",
         "convert": sm90("marlin", "triton-wna16")})
    # The families of issue 30: the same W4A16 g32 scheme, routers left unquantized.
    for fam in NEW_FAMILIES:
        f["ct-w4a16-g32-" + fam] = (
            CT, fam, "W4A16 symmetric, group 32",
            (lambda fam: lambda w, n: llmcompressor_fixture(
                fam, ct_modifier({"group_0": ct_scheme(4, 32, True, ["Linear"])},
                                 ignore=ROUTER_IGNORE + (VISION_IGNORE if fam == "llama4" else [])),
                w, n, small_shape(fam) if fam in LATE_FAMILIES else None))(fam),
            {"method": "compressed-tensors-pack-quantized",
             "convert": sm90("marlin", "triton-wna16"), "verify": family_verify(fam)})
    f["ct-w8a16-channel-mixtral"] = (
        CT, "mixtral", "W8A16 symmetric, channel",
        lambda w, n: llmcompressor_fixture(
            "mixtral", ct_modifier({"group_0": ct_scheme(8, None, True, ["Linear"], "channel")}),
            w, n),
        {"method": "compressed-tensors-pack-quantized", "convert": sm90("marlin")})
    f["ct-two-groups-experts-w4g32-rest-w8-mixtral"] = (
        CT, "mixtral",
        "group_0 Linear W8A16 channel; group_1 re: experts W4A16 symmetric g32",
        lambda w, n: llmcompressor_fixture(
            "mixtral", ct_modifier({
                "group_0": ct_scheme(8, None, True, ["Linear"], "channel"),
                "group_1": ct_scheme(4, 32, True,
                                     [r"re:.*experts\.\d+\.(gate|up|down)_proj$"])}),
            w, n),
        {"method": "compressed-tensors-pack-quantized",
         "convert": sm90("marlin", "triton-wna16")})
    f["ct-two-groups-asym-experts-qwen3"] = (
        CT, "qwen3",
        "group_0 Linear W4A16 symmetric g128; group_1 re: experts W4A16 asymmetric g32",
        lambda w, n: llmcompressor_fixture(
            "qwen3", ct_modifier({
                "group_0": ct_scheme(4, 128, True, ["Linear"]),
                "group_1": ct_scheme(4, 32, False,
                                     [r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"])}), w, n),
        # Read as asymmetric (the dequant test), and refused: no vLLM MoE path for CT takes
        # zero points.
        {"method": "compressed-tensors-pack-quantized",
         "refuse": {"exit": 4, "contains": "asymmetric", "target_arch": "sm90"}})
    f["ct-w8a8-int8-qwen3"] = (
        CT, "qwen3", "W8A8 int8, channel weights, dynamic per-token activations",
        lambda w, n: llmcompressor_fixture("qwen3", ct_modifier(scheme="W8A8"), w, n),
        {"method": "compressed-tensors-int-quantized", "convert": sm90("triton-int8")})
    f["ct-fp8-block-qwen3"] = (
        CT, "qwen3", "FP8_BLOCK (weight F8_E4M3, weight_scale BF16 per 128x128 block)",
        lambda w, n: llmcompressor_fixture("qwen3", ct_modifier(scheme="FP8_BLOCK"), w, n),
        {"method": "compressed-tensors-fp8-block", "convert": sm100("trtllm-fp8-block")})
    f["ct-mxfp8-qwen3"] = (
        CT, "qwen3", "MXFP8 (E8M0 scales per 32)",
        lambda w, n: llmcompressor_fixture("qwen3", ct_modifier(scheme="MXFP8"), w, n),
        {"method": "compressed-tensors-mxfp8", "convert": sm100("trtllm-mxfp8")})
    # FP4 (issue 24): read exactly and converted on sm80, where vLLM 0.33 runs FP4 MoE through
    # Marlin (prepare_nvfp4_moe_layer_for_marlin / prepare_moe_fp4_layer_for_marlin).
    fp4_marlin = lambda backend: [{"backend": backend, "target_arch": "sm80"}]
    f["ct-nvfp4a16-qwen3"] = (
        CT, "qwen3", "NVFP4A16 (e2m1, e4m3 scales per 16, weight_global_scale; weights only)",
        lambda w, n: llmcompressor_fixture("qwen3", ct_modifier(scheme="NVFP4A16"), w, n),
        {"method": "compressed-tensors-nvfp4", "convert": fp4_marlin("marlin-nvfp4")})
    f["ct-nvfp4-qwen3"] = (
        CT, "qwen3", "NVFP4 (W4A4: weights as NVFP4A16 plus input_global_scale)",
        lambda w, n: llmcompressor_fixture("qwen3", ct_modifier(scheme="NVFP4"), w, n),
        {"method": "compressed-tensors-nvfp4", "convert": fp4_marlin("marlin-nvfp4")})
    f["ct-mxfp4a16-qwen3"] = (
        CT, "qwen3", "MXFP4A16 (e2m1, E8M0 scales per 32)",
        lambda w, n: llmcompressor_fixture("qwen3", ct_modifier(scheme="MXFP4A16"), w, n),
        {"method": "compressed-tensors-mxfp4", "convert": fp4_marlin("marlin-mxfp4")})
    f["modelopt-nvfp4-qwen3"] = (
        MO, "qwen3", "NVFP4 (NVFP4_DEFAULT_CFG), hf_quant_config.json side file",
        lambda w, n: modelopt_fixture("qwen3", "NVFP4_DEFAULT_CFG", w, n, dequant_modelopt_nvfp4),
        {"method": "modelopt-nvfp4", "convert": fp4_marlin("marlin-nvfp4")})
    f["autoround-native-sym-qwen3"] = (
        AR, "qwen3", "auto_round format (auto_round:auto_gptq packing), 4-bit symmetric g32",
        lambda w, n: auto_round_fixture("qwen3", "auto_round", 4, 32, True, w, n),
        {"method": "gptq", "convert": sm90("marlin", "triton-wna16")})
    f["autoround-native-asym-qwen3"] = (
        AR, "qwen3", "auto_round format (auto_round:auto_awq packing), 4-bit asymmetric g32",
        lambda w, n: auto_round_fixture("qwen3", "auto_round", 4, 32, False, w, n),
        {"method": "awq", "convert": sm90("marlin", "triton-wna16")})
    f["autoround-autogptq-asym-mixtral"] = (
        AR, "mixtral", "auto_gptq export, 4-bit asymmetric g32 (GPTQ v1 zeros)",
        lambda w, n: auto_round_fixture("mixtral", "auto_gptq", 4, 32, False, w, n),
        {"method": "gptq", "convert": sm90("triton-wna16")})
    # The families of issue 30 in auto-round's own format, symmetric (auto_round:auto_gptq
    # packing, read as GPTQ v1).
    for fam in NEW_FAMILIES:
        f["autoround-native-sym-" + fam] = (
            AR, fam, "auto_round format (auto_round:auto_gptq packing), 4-bit symmetric g32",
            (lambda fam: lambda w, n: auto_round_fixture(fam, "auto_round", 4, 32, True, w, n,
                                                         small_shape(fam)))(fam),
            {"method": "gptq", "convert": sm90("marlin", "triton-wna16"),
             "verify": family_verify(fam)})
    f["autoround-autoawq-sym-qwen3"] = (
        AR, "qwen3", "auto_awq export of a symmetric scheme (zero_point false)",
        lambda w, n: auto_round_fixture("qwen3", "auto_awq", 4, 32, True, w, n),
        {"method": "awq", "convert": sm90("marlin", "triton-wna16")})
    f["modelopt-mxfp8-qwen3"] = (
        MO, "qwen3", "MXFP8 (MXFP8_DEFAULT_CFG), hf_quant_config.json side file",
        lambda w, n: modelopt_fixture("qwen3", "MXFP8_DEFAULT_CFG", w, n),
        {"method": "modelopt-mxfp8", "convert": sm100("trtllm-mxfp8")})
    f["modelopt-mxfp8-mixtral"] = (
        MO, "mixtral", "MXFP8 (MXFP8_DEFAULT_CFG)",
        lambda w, n: modelopt_fixture("mixtral", "MXFP8_DEFAULT_CFG", w, n),
        {"method": "modelopt-mxfp8", "convert": sm100("trtllm-mxfp8")})
    f["gptqmodel-v1-asym-descact-qwen3"] = (
        GM, "qwen3", "GPTQ v1 (checkpoint_format gptq), 4-bit asymmetric g32, desc_act",
        lambda w, n: gptqmodel_fixture("qwen3", 4, 32, False, True, "gptq", None, 0, w, n),
        # Read exactly (the dequant test); no vLLM MoE path serves asymmetric GPTQ with act-order.
        {"method": "gptq",
         "refuse": {"exit": 4, "contains": "desc_act", "target_arch": "sm90"}})
    f["gptqmodel-v1-zero0-qwen3"] = (
        GM, "qwen3", "GPTQ v1, 4-bit asymmetric g32, zero points of 0 (borrow across the word)",
        lambda w, n: gptqmodel_fixture("qwen3", 4, 32, False, False, "gptq", None, 8, w, n),
        {"method": "gptq",
         "refuse": {"exit": 4, "contains": "zero point of 0", "target_arch": "sm90"}})
    f["gptqmodel-v2-sym-mixtral"] = (
        GM, "mixtral", "GPTQ v2 (gptq_v2), 4-bit symmetric g32",
        lambda w, n: gptqmodel_fixture("mixtral", 4, 32, True, False, "gptq_v2", None, 0, w, n),
        {"method": "gptq", "convert": sm90("marlin", "triton-wna16")})
    # The families of issue 30 as GPTQModel writes them by default (QuantizeConfig's format
    # gptq, i.e. v1 zeros; desc_act off), 4-bit symmetric g32. gpt_oss is not here: moepack
    # refuses GPTQModel's half-split gpt-oss by name (docs/producers.md).
    for fam in NEW_FAMILIES:
        f["gptqmodel-v1-sym-" + fam] = (
            GM, fam, "GPTQ v1 (checkpoint_format gptq), 4-bit symmetric g32",
            (lambda fam: lambda w, n: gptqmodel_fixture(fam, 4, 32, True, False, "gptq", None, 0,
                                                        w, n, gptqmodel_shape(fam)))(fam),
            {"method": "gptq", "convert": sm90("marlin", "triton-wna16"),
             "verify": family_verify(fam)})
    for name, words in UNQUANTIZED_EXPERTS.items():
        producer, fam, scheme, build, _ = f[name]
        f[name] = (producer, fam, scheme, build,
                   {"method": "gptq", "refuse": {"exit": 4, "contains": words,
                                                 "target_arch": "sm90",
                                                 "unquantized_experts": True}})
    f["gptqmodel-dynamic-experts-g64-qwen3"] = (
        GM, "qwen3", "GPTQ v1 4-bit symmetric g32, dynamic: experts g64",
        lambda w, n: gptqmodel_fixture("qwen3", 4, 32, True, False, "gptq",
                                       {r"+:.*mlp\.experts\..*": {"group_size": 64}}, 0, w, n),
        {"method": "gptq", "convert": sm90("marlin", "triton-wna16")})
    return f


KEEP = re.compile(r"^(config\.json|.*\.safetensors|model\.safetensors\.index\.json|"
                  r"quantization_config\.json|quantize_config\.json|hf_quant_config\.json)$")


def write_fixture(name, producer, family, scheme, ckpt, dequant, expect):
    packages = ("llmcompressor", "compressed-tensors", "auto-round", "gptqmodel",
                "nvidia-modelopt", "transformers", "torch")
    if producer == GM:
        # The GPTQModel venv sees the producers' venv beneath its own (docs/producers.md): only
        # GPTQModel, the defuser that splits fused experts for it, and what it ran on.
        packages = ("gptqmodel", "defuser", "transformers", "torch")
    dst = os.path.join(FIXTURES, name)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.makedirs(os.path.join(dst, "ckpt"))
    for fn in sorted(os.listdir(ckpt)):
        if KEEP.match(fn):
            shutil.copy(os.path.join(ckpt, fn), os.path.join(dst, "ckpt", fn))
    save_file({k: v.contiguous() for k, v in dequant.items()},
              os.path.join(dst, "dequant.safetensors"))
    meta = {
        "producer": producer,
        "versions": {p: version(p) for p in packages if version(p)},
        "family": family,
        "scheme": scheme,
        "dequant": "the producer's own dequantization of each expert Linear (generate.py)",
    }
    meta.update(expect)
    with open(os.path.join(dst, "producer.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
        f.write("\n")


def main(names):
    table = fixtures()
    names = names or [n for n in table if n not in NOT_COMMITTED]
    work = tempfile.mkdtemp(prefix="moepack-producers-")
    failed = []
    for name in names:
        producer, family, scheme, build, expect = table[name]
        print(f"== {name} ({producer}: {scheme})", flush=True)
        try:
            ckpt, dequant = build(work, name)
        except Exception as e:  # a producer that cannot write this scheme here: say so
            traceback.print_exc()
            print(f"!! {name}: {type(e).__name__}: {e}", flush=True)
            failed.append(name)
            continue
        write_fixture(name, producer, family, scheme, ckpt, dequant, expect)
    shutil.rmtree(work, ignore_errors=True)
    if failed:
        print("not generated: " + ", ".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

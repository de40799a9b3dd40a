"""moepack-vllm: serves moepack-converted MoE checkpoints in vLLM 0.33.x.

A moepack output's config.json says quantization_config.quant_method "moepack", which stock
vLLM refuses ("Unknown quantization method"). This plugin, loaded by vLLM through the
`vllm.general_plugins` entry point, registers that method: the expert tensors load as they are
(kernel-format names and shapes, byte for byte), post-processing only builds the kernel object,
and everything else is delegated to the source's own quantization method.
"""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Entry point of `vllm.general_plugins`: registers the "moepack" quantization method."""
    global _registered
    if _registered:
        return
    from . import config  # noqa: F401  (registers on import)
    from .moe import patch_default_loader, patch_gpt_oss_loader, patch_routed_experts_loader

    patch_routed_experts_loader()
    patch_gpt_oss_loader()
    patch_default_loader()
    _registered = True

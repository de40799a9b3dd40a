"""Builds a model through vLLM 0.33's own config and model loader, on the CPU.

Used by test_serving.py, in the test-only venv (.venv-vllm). VLLM_TARGET_DEVICE=cpu selects
vLLM's CPU platform; the CUDA wheel still imports there, and nothing needs a GPU until a
kernel runs (the forward test substitutes CPU stand-ins for those).
"""

from __future__ import annotations

import os
import socket

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

_dist_ready = False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine_config(model_dir: str, **overrides):
    """vLLM's VllmConfig for `model_dir`, as `vllm serve model_dir` would build it."""
    from vllm.engine.arg_utils import EngineArgs

    kw = dict(model=model_dir, dtype="bfloat16", enforce_eager=True, load_format="safetensors",
              max_model_len=128, skip_tokenizer_init=True)
    kw.update(overrides)
    return EngineArgs(**kw).create_engine_config()


def init_single_process_distributed() -> None:
    global _dist_ready
    if _dist_ready:
        return
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    initialize_model_parallel(1, 1)
    _dist_ready = True


def load_model(model_dir: str, **overrides):
    """(model, vllm_config): the model loaded by vLLM's default loader, post-processing done."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    cfg = engine_config(model_dir, **overrides)
    with set_current_vllm_config(cfg):
        init_single_process_distributed()
        model = get_model(vllm_config=cfg)
    return model, cfg

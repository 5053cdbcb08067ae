"""minitransformer: a from-scratch, readable, real LLM inference engine (NumPy on the CPU, CuPy on a GPU).

    from minitransformer import load_model, generate, stream, SamplingParams
    model = load_model()                        # SmolLM2-135M-Instruct, fetched on first use
    out = generate(model, "The capital of France is", SamplingParams(max_tokens=16, temperature=0.0))
    for delta in stream(model, "Tell me a story", SamplingParams(max_tokens=64)): print(delta.text, end="")

Everything one request needs is in core/ (docs/code_tour.md reads it in order); importing this package loads core/
and nothing else. The optimizations plug into core's protocols and load only when asked for by name: here,
`load_model` turns names into plug-ins (a known model's file from models.py, attention="kernels" from kernels/,
dtype="float16" from quantize/, comm= from parallel/), and generate's `runner=` takes no_cache.RecomputeRunner or
speculative.speculative_runner(...). See README.md for the map of the package and the lessons.
"""

from __future__ import annotations

from pathlib import Path

from .core.config import ModelConfig
from .core.errors import DeviceError, InputError, MiniTransformerError, ModelFetchError, ModelFileError
from .core.generate import generate, stream
from .core.kv_cache import KVCache, estimate_kv_bytes
from .core.model import Transformer
from .core.request import Delta, Request, Result
from .core.sampling_params import SamplingParams
from .core.tokenizer import Tokenizer

__all__ = ["load_model", "load_tokenizer", "generate", "stream", "SamplingParams", "Request", "Result", "Delta",
           "KVCache", "estimate_kv_bytes", "Transformer", "Tokenizer", "ModelConfig", "MiniTransformerError",
           "ModelFileError", "ModelFetchError", "InputError", "DeviceError", "ATTENTION", "DTYPES"]
__version__ = "0.1.0"

ATTENTION = ("arrays", "kernels", "auto")       # load_model(attention=): core's arrays, kernels/, or by device
DTYPES = ("float32", "float16")                 # load_model(dtype=): as loaded, or float16 storage (quantize/)


def load_model(path: str | Path | None = None, device: str = "cpu", attention: str = "auto",
               dtype: str = "float32", comm=None) -> Transformer:
    """A model by file or by name (None: the default SmolLM2-135M-Instruct; "gemma3-270m": a known model, fetched on
    first use: models.py) on `device` ("cpu" or "gpu"), through core.loading.load_model with the plug-ins named:

    attention: "arrays" (core/attention.py), "kernels" (kernels/attention_backend.py: flash_prefill / paged_decode,
    also on the CPU runner) or "auto" (kernels on the GPU, arrays on the CPU).
    dtype: "float32" (exact comparison with the CPU and HF) or "float16": float16 storage of every matrix, embedding
    included, with float32 accumulation (quantize.quantize_model(model, "f16", embedding="f16"); half the weight
    bytes; norms, activations, KV cache and logits stay float32). "bfloat16" is refused (check_dtype says why).
    comm: this process's communicator when the model is split over several (parallel/): the rank loads only its
    heads and FFN columns (parallel/plan.py) and its forward all-reduces; None or a world of 1 loads everything.
    """
    from .core.loading import load_model as load_file
    from .models import resolve_model_path

    check_dtype(dtype)
    if attention not in ATTENTION:
        raise InputError(f"unknown attention {attention!r}; choose one of {', '.join(ATTENTION)}")
    split = comm is not None and comm.world_size > 1
    if split and dtype != "float32":
        raise InputError(f"tensor parallelism loads float32 weights; dtype {dtype} is not split yet")
    shard = weights = None
    if split:
        from .parallel.plan import ShardPlan
        shard = ShardPlan.hook(comm)
    if dtype == "float16":
        from .quantize import quantize_model
        weights = lambda model: quantize_model(model, "f16", embedding="f16")
    model = load_file(resolve_model_path(path), device, shard=shard, weights=weights)
    if attention == "kernels" or (attention == "auto" and device == "gpu"):
        from .kernels.attention_backend import kernel_attention
        model.attention = kernel_attention(model.config)
    return model


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """The tokenizer of a GGUF model file or of a known model by name (default: the default model, fetched if
    missing)."""
    from .core.tokenizer import load_tokenizer as load_file
    from .models import resolve_model_path

    return load_file(resolve_model_path(path))


def check_dtype(dtype: str) -> None:
    """float32 and float16 (storage; float32 accumulation) are implemented; say why for the others instead of
    silently computing in float32."""
    if dtype in DTYPES:
        return
    if dtype == "bfloat16":
        raise InputError("dtype bfloat16 is not available: NumPy has no bfloat16 type, so the CPU could not check "
                         "the GPU's arithmetic; use float16 or float32")
    raise InputError(f"unknown dtype {dtype!r}; choose float32 or float16")

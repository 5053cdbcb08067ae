"""`load_model`: a GGUF file -> a ready Transformer (tokenizer, weights dequantized once, attention chosen once).

It sits above quantize/ because a float16 load is the float32 load followed by quantize_model; everything below
(model.py, the caches, the stages) takes a built model and never loads one.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..models import dequantize, open_gguf, resolve_model_path
from ..parallel.communicator import Communicator
from ..parallel.plan import ShardPlan
from ..quantize import quantize_model
from .attention import choose_attention
from .backend import DTYPE, get_xp
from .config import QKV_TENSORS, ModelConfig
from .errors import InputError, ModelFileError
from .model import LAYER_WEIGHTS, LayerWeight, LayerWeights, Transformer, layer_weights
from .tokenizer import Tokenizer


def load_model(path: str | Path | None = None, device: str = "cpu", attention: str = "auto",
               dtype: str = "float32", comm: Communicator | None = None) -> Transformer:
    """Load a llama-architecture GGUF (the default SmolLM2-135M-Instruct when `path` is None, fetched on first
    use) onto `device` ("cpu" or "gpu"): every tensor dequantized once to float32.

    attention: "arrays" (layers.attention), "kernels" (flash_prefill / paged_decode, also on the CPU runner) or
    "auto" (kernels on the GPU, arrays on the CPU); chosen here, once (attention_backend.py).
    dtype: "float32" (the default: exact comparison with the CPU and HF) or "float16": float16 storage of every
    matrix, embedding included, with float32 accumulation = this float32 load, then quantize.quantize_model(model,
    "f16", embedding="f16") (half the weight bytes; norms, activations, KV cache and logits stay float32).
    "bfloat16" is refused (check_dtype says why).
    comm: this process's communicator when the model is split over several (parallel/): the rank loads only its
    heads and FFN columns (parallel/plan.py) and its forward all-reduces; None or a world of 1 loads everything.
    """
    check_dtype(dtype)
    if comm is not None and comm.world_size > 1 and dtype != "float32":
        raise InputError(f"tensor parallelism loads float32 weights; dtype {dtype} is not split yet")
    start = time.perf_counter()
    xp = get_xp(device)
    path = resolve_model_path(path)
    reader = open_gguf(path)
    config = ModelConfig.from_gguf(reader)
    plan = ShardPlan(config, comm.world_size, comm.rank) if comm is not None and comm.world_size > 1 else None
    config = plan.shard_config() if plan is not None else config      # this rank's heads and FFN columns
    tokenizer = Tokenizer.from_gguf(reader)
    tensors = {t.name: t for t in reader.tensors}

    def load(name: str, shape: tuple, transpose: bool = False, rows=None, columns=None):
        """Dequantize one tensor (or only its rows / columns: a shard), check its shape, lay it out as (in, out) if
        asked, move it to the device."""
        if name not in tensors:
            raise ModelFileError(f"{path}: tensor {name} is missing; not a complete llama-architecture model")
        array = dequantize(tensors[name], rows, columns)       # (out, in) for matrices
        if transpose:
            array = np.ascontiguousarray(array.T)              # (in, out); the (out, in) copy is dropped here
        if array.shape != shape:
            raise ModelFileError(f"{path}: tensor {name} has shape {array.shape}, expected {shape} from the "
                                 "metadata")
        return xp.asarray(array, dtype=DTYPE)

    check_biases(config, path)
    D, V = config.d_model, config.vocab_size
    layers = [LayerWeights(**{w.field: load_layer_weight(load, w, config, i, xp, plan) for w in layer_weights(config)})
              for i in range(config.n_layers)]
    embedding = load("token_embd.weight", (V, D))
    lm_head = embedding.T if config.tied_embeddings else load("output.weight", (D, V), transpose=True)
    final_norm = load("output_norm.weight", (D,))
    model = Transformer(config, tokenizer, embedding, layers, final_norm, lm_head, xp, device, Path(path),
                        load_seconds=time.perf_counter() - start,
                        attention=choose_attention(attention, device, config))
    model.comm = comm if plan is not None else None
    if dtype == "float16":
        model = quantize_model(model, "f16", embedding="f16")
        model.load_seconds = time.perf_counter() - start
    return model


def load_layer_weight(load, weight: LayerWeight, config: ModelConfig, layer: int, xp, plan: ShardPlan | None = None):
    """One entry of LAYER_WEIGHTS for block `layer`: its GGUF tensors, each checked against its shape from the
    config, laid side by side as columns (q | k | v, gate | up): a vector as it is, a matrix as (in, out).

    With a plan (tensor parallelism; `config` is then the shard's) only this rank's part of each tensor is read:
    a column-split weight's outputs (the file's rows: its q heads, its KV heads, its FFN columns; a bias's entries
    for those heads), a row-split weight's inputs (the file's columns)."""
    parts = [load(name, shape, transpose=weight.is_matrix, **shard_of(weight, size, plan))
             for name, (_, shape), size in zip(weight.gguf_names(layer), weight.tensor_shapes(config),
                                               weight.columns)]
    return parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=1 if weight.is_matrix else 0)


def shard_of(weight: LayerWeight, size: str, plan: ShardPlan | None) -> dict:
    """load()'s rows= or columns= for one tensor of `weight` whose outputs are `size`: nothing without a plan or
    for a weight every rank holds whole."""
    if plan is None or weight.split is None:
        return {}
    if weight.split == "column":
        return {"rows": plan.span(size)}              # GGUF stores (out, in): outputs are the file's rows
    return {"columns": plan.span(weight.rows or "")}


def check_biases(config: ModelConfig, path) -> None:
    """The forward pass adds one bias, Qwen2's on q, k and v together (LAYER_WEIGHTS' b_qkv); a file that gives any
    other layer weight a bias, or only some of q, k and v one, is refused rather than run wrong."""
    unused = sorted(set(config.bias_tensors) - (set(QKV_TENSORS) if config.qkv_bias else set()))
    if unused:
        with_bias = [w.field for w in LAYER_WEIGHTS if w.kind == "weight" and set(w.tensors) & set(unused)]
        raise ModelFileError(f"{path}: the layers' {', '.join(with_bias)} have biases ({', '.join(unused)}), which "
                             "minitransformer does not add (it adds q, k and v biases, all three together)")


def check_dtype(dtype: str) -> None:
    """float32 and float16 (storage; float32 accumulation) are implemented; say why for the others instead of
    silently computing in float32."""
    if dtype in ("float32", "float16"):
        return
    if dtype == "bfloat16":
        raise InputError("dtype bfloat16 is not available: NumPy has no bfloat16 type, so the CPU could not check "
                         "the GPU's arithmetic; use float16 or float32")
    raise InputError(f"unknown dtype {dtype!r}; choose float32 or float16")

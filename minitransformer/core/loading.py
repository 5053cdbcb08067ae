"""`load_model`: a GGUF file -> a ready Transformer (tokenizer, weights dequantized once to float32).

Two hooks let an optimization change what is loaded without this file knowing it (both are None for one process
with float32 weights, the default):

    shard(config) -> Shard        tensor parallelism (parallel/plan.py's ShardPlan.hook): which heads and FFN columns
                                  this process loads, and the all-reduce its forward calls after each block
    weights(model) -> model       a weight format (quantize/: float16, int8, int4): the float32 model stored another way

Naming a model ("smollm2-135m", or nothing for the default), fetching its file, and choosing plug-ins by name
(attention="kernels", dtype="float16", comm=...) is the package root's `minitransformer.load_model`, which calls this
with a path and the hooks.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .backend import DTYPE, get_xp
from .config import QKV_TENSORS, ModelConfig
from .errors import InputError, ModelFileError
from .gguf_file import dequantize, open_gguf
from .metrics import now
from .model import LAYER_WEIGHTS, AllReduce, LayerWeight, LayerWeights, Transformer, layer_weights
from .tokenizer import Tokenizer


class Shard(Protocol):
    """This process's part of a model split over several (parallel/plan.py's ShardPlan is one)."""

    @property
    def comm(self) -> AllReduce: ...                 # the forward's all-reduce after each block (model.comm)

    def shard_config(self) -> ModelConfig: ...       # the config this process's forward and cache run with

    def span(self, size: str) -> slice: ...          # its part of a split size ("q_dim", "kv_dim", "ffn_dim")


def load_model(path: str | Path, device: str = "cpu", *, shard: Callable[[ModelConfig], Shard] | None = None,
               weights: Callable[[Transformer], Any] | None = None) -> Transformer:
    """Load a llama-family GGUF file onto `device` ("cpu" or "gpu"): every tensor dequantized once to float32.

    shard: called with the whole model's config, it says which part this process loads (None: all of it).
    weights: called with the loaded float32 model, it returns the model whose weights are stored as it chooses.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"model path must be a str or an os.PathLike (pathlib.Path), got {type(path).__name__} "
                         f"{path!r:.80}")
    start = now()
    xp = get_xp(device)
    reader = open_gguf(path)
    config = ModelConfig.from_gguf(reader)
    plan = shard(config) if shard is not None else None
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
    model = Transformer(config, tokenizer, embedding, layers, final_norm, lm_head, xp, device, Path(path))
    model.comm = plan.comm if plan is not None else None
    if weights is not None:
        model = weights(model)
    model.load_seconds = now() - start
    return model


def load_layer_weight(load, weight: LayerWeight, config: ModelConfig, layer: int, xp, plan: Shard | None = None):
    """One entry of LAYER_WEIGHTS for block `layer`: its GGUF tensors, each checked against its shape from the
    config, laid side by side as columns (q | k | v, gate | up): a vector as it is, a matrix as (in, out).

    With a plan (tensor parallelism; `config` is then the shard's) only this rank's part of each tensor is read:
    a column-split weight's outputs (the file's rows: its q heads, its KV heads, its FFN columns; a bias's entries
    for those heads), a row-split weight's inputs (the file's columns)."""
    parts = [load(name, shape, transpose=weight.is_matrix, **shard_of(weight, size, plan))
             for name, (_, shape), size in zip(weight.gguf_names(layer), weight.tensor_shapes(config),
                                               weight.columns)]
    return parts[0] if len(parts) == 1 else xp.concatenate(parts, axis=1 if weight.is_matrix else 0)


def shard_of(weight: LayerWeight, size: str, plan: Shard | None) -> dict:
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

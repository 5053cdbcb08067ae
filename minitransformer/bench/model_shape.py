"""What a model's shape costs, from its config and from its loaded arrays: the arithmetic behind lesson
17_model_shape, which puts SmolLM2-135M, Gemma 3 270M and Llama 3.1 8B's shape side by side.

    parameters_by_place  a model's weights counted by where they sit: the embedding, an untied lm_head, attention
                         (q|k|v and o), the FFN (gate|up and down), the norms; from the config alone
    counted_parameters   the same places counted from a loaded model's arrays (the check on the arithmetic)
    decode_read_bytes    the weight bytes one decode step reads, the layers in one format and the lm_head in another
    FORMATS              the formats lesson 17 compares (float32, bf16, int8, int4 layers with an int8 lm_head, int4)
    decode_call          one decode step of a model on its own cache, ready to time in turns (measure.interleaved)
    prefill_call         one prefill of a prompt into a fresh cache, the same

Why the places matter: a decode step multiplies every layer weight by one row *and* the whole lm_head (vocabulary x
d_model) by one row, so it reads both from memory for every token; a prefill of P tokens reads each weight once for
all P rows and runs the lm_head on the last row only. A model whose parameters sit mostly in a big vocabulary (Gemma
3 270M: 262,144 tokens) pays for them at decode, hardly at prefill. The token's own embedding row is one row of
d_model values: decode_read_bytes leaves it out (it is inside the lm_head when the two are tied).
"""

from __future__ import annotations

import math

import numpy as np

from ..core.decode import decode_step
from ..core.kv_cache import KVCache
from ..core.model import layer_weights
from ..core.prefill import prefill
from ..quantize.linear import quantized_bytes

# LayerWeights field -> where lesson 17 counts it; a vector (a norm's scale) counts as "norms"
PLACE = {"w_qkv": "attention", "wo": "attention", "w_gate_up": "FFN", "w_down": "FFN"}
PLACES = ("embedding", "lm_head", "attention", "FFN", "norms")     # lm_head: 0 when tied (the embedding reused)

# name -> (the layers' scheme, the lm_head's scheme), quantize.SCHEMES' names: "f16" is 2 bytes a weight, as bf16.
# "int4, lm_head int8" is llama.cpp's habit in its 4-bit files (token_embd / output kept at 8 bits or more) and
# quantize_model's default.
FORMATS = {"float32": ("f32", "f32"), "bf16": ("f16", "f16"), "int8": ("int8", "int8"),
           "int4, lm_head int8": ("int4", "int8"), "int4": ("int4", "int4")}


def parameters_by_place(config) -> dict[str, int]:
    """{place: weights} for a model of `config` (PLACES' order); the sum is viz_capacity.parameter_count."""
    found = dict.fromkeys(PLACES, 0)
    found["embedding"] = config.vocab_size * config.d_model
    found["lm_head"] = 0 if config.tied_embeddings else config.vocab_size * config.d_model
    for weight in layer_weights(config):
        found[PLACE.get(weight.field, "norms")] += config.n_layers * math.prod(weight.shape(config))
    found["norms"] += config.d_model                                   # the final norm
    return found


def counted_parameters(model) -> dict[str, int]:
    """parameters_by_place's places counted from a loaded model's arrays, not from its config."""
    found = dict.fromkeys(PLACES, 0)
    found["embedding"] = int(model.embedding.size)
    found["lm_head"] = 0 if model.config.tied_embeddings else int(model.lm_head.size)
    for layer in model.layers:
        for weight in layer_weights(model.config):
            found[PLACE.get(weight.field, "norms")] += int(getattr(layer, weight.field).size)
    found["norms"] += int(model.final_norm.size)
    return found


def decode_read_bytes(config, layers: str = "f32", head: str = "f32") -> tuple[int, int]:
    """(bytes of weights one decode step reads, of which the lm_head's): every layer matrix stored as `layers` and
    the lm_head as `head` (quantize.linear.quantized_bytes: values plus their scales), norms in float32 as
    quantize_model keeps them. For a tied model in float32 this is Transformer.weight_bytes: every weight, once."""
    matrices = sum(quantized_bytes(w.shape(config)[1], w.shape(config)[0], layers)
                   for w in layer_weights(config) if w.is_matrix)
    vectors = sum(4 * w.shape(config)[0] for w in layer_weights(config) if not w.is_matrix)
    lm_head = quantized_bytes(config.vocab_size, config.d_model, head)
    return config.n_layers * (matrices + vectors) + 4 * config.d_model + lm_head, lm_head


def decode_call(model, prompt: list[int], steps: int, storage: str = "f32"):
    """A call that runs one decode step of `model` on its own cache (keys and values stored as `storage`), holding
    `prompt` and room for `steps` more tokens (the timed steps and the warm-up's): each call one token later."""
    cache = KVCache(model.config, len(prompt) + steps, xp=model.xp, storage=storage)
    token = int(np.asarray(prefill(model, prompt, cache)).argmax(-1)[0])
    return lambda: decode_step(model, [token], cache)


def prefill_call(model, prompt: list[int]):
    """A call that prefills `prompt` into a fresh cache of its length: the whole prefill stage, cache writes
    included (allocating a cache of a few hundred tokens is a small part of it)."""
    return lambda: prefill(model, prompt, KVCache(model.config, len(prompt), xp=model.xp))

"""How many users fit: the KV cache of many requests against the memory left after the weights (lessons 03 and 09).

    users_that_fit.png   the KV bytes of N requests at a few context lengths, against the memory the weights leave,
                         for this model on this machine and for an 8B model (Llama 3.1 8B's shape, bf16) on one
                         H200; each line is marked where it crosses: the number of requests that fit

For this model the bytes per token are a real KVCache's own (`bytes_used` after a prefill, divided by its length)
and the weights are the loaded model's; for the 8B model both come from its shape (estimate_kv_bytes and
parameter_count) at 2 bytes per value. Either way a request's cache is bytes per token x its context, so the
requests that fit are (memory x the share a server gives the model - weights) // (bytes per token x context).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..core.config import ModelConfig
from ..core.kv_cache import KVCache, estimate_kv_bytes
from ..core.model import layer_parameters
from ..core.prefill import prefill
from .viz_concepts import pyplot

# Llama 3.1 8B's shape, from its config.json on the Hugging Face Hub (meta-llama/Llama-3.1-8B): only the sizes
# matter here; no weights are loaded.
LLAMA_3_1_8B = ModelConfig(name="Llama-3.1-8B (shape)", n_layers=32, d_model=4096, n_heads=32, n_kv_heads=8,
                           head_dim=128, ffn_dim=14336, norm_eps=1e-5, rope_base=500000.0, context_length=131072,
                           vocab_size=128256, tied_embeddings=False)
H200_MEMORY_BYTES = 141e9          # NVIDIA H200 datasheet: 141 GB of HBM3e
MEMORY_SHARE = 0.9                 # vLLM's default gpu_memory_utilization: the rest for activations and the runtime
CONTEXTS = (1024, 8192, 32768)     # tokens per request (prompt + output)
BF16 = 2
GB = 1e9                           # decimal, as memory datasheets count


def parameter_count(config: ModelConfig) -> int:
    """Weights of the model: every layer's weights (model.LAYER_WEIGHTS: four matrices, two norms), the token
    embedding, the final norm, and the lm_head unless it is the embedding reused (tied)."""
    layer = layer_parameters(config)
    embeddings = config.vocab_size * config.d_model * (1 if config.tied_embeddings else 2)
    return config.n_layers * layer + embeddings + config.d_model


def memory_bytes() -> int:
    """This machine's physical memory (what /proc/meminfo calls MemTotal, in bytes)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass
class Capacity:
    """One model on one machine: how many requests of each context fit in the memory the weights leave."""
    label: str
    memory: float                  # bytes on the device
    weight_bytes: float
    kv_bytes_per_token: float      # K and V of one token, every layer
    contexts: tuple[int, ...] = CONTEXTS

    @property
    def left(self) -> float:
        """Bytes for the KV cache: the server's share of the memory, less the weights."""
        return self.memory * MEMORY_SHARE - self.weight_bytes

    def users(self, context: int) -> int:
        return int(self.left // (self.kv_bytes_per_token * context))


def measured_kv_bytes_per_token(model, tokens: int = 32) -> float:
    """Bytes a real KVCache holds per token after prefilling `tokens` tokens."""
    cache = KVCache(model.config, tokens, xp=model.xp)
    prefill(model, model.tokenizer.encode("a " * tokens)[:tokens], cache)
    return cache.bytes_used / cache.length


def capacities(model) -> list[Capacity]:
    """This model on this machine, as loaded; the 8B shape in bf16 on an H200."""
    def up_to(config):                             # no request longer than the model's context
        return tuple(c for c in CONTEXTS if c <= config.context_length)
    return [Capacity(f"{model.path.stem} (float32) on this machine", memory_bytes(), model.weight_bytes,
                     measured_kv_bytes_per_token(model), up_to(model.config)),
            Capacity("Llama 3.1 8B shape (bf16) on one H200", H200_MEMORY_BYTES,
                     parameter_count(LLAMA_3_1_8B) * BF16,
                     estimate_kv_bytes(LLAMA_3_1_8B, 1, dtype=np.float16),    # float16's 2 bytes, as bf16's
                     up_to(LLAMA_3_1_8B))]


def draw_users_that_fit(model, path) -> list[Capacity]:
    """One panel per Capacity: KV bytes against requests, a line per context, the memory left as the ceiling."""
    plt = pyplot()
    cases = capacities(model)
    fig, axes = plt.subplots(1, len(cases), figsize=(13, 5.2))
    for ax, case in zip(axes, cases):
        users = np.unique(np.geomspace(1, 4 * max(case.users(min(case.contexts)), 4), 200).astype(int))
        for context, colour in zip(case.contexts, ("tab:blue", "tab:orange", "tab:red")):
            fit = case.users(context)
            ax.plot(users, users * context * case.kv_bytes_per_token / GB, color=colour,
                    label=f"{context:,}-token requests: {fit:,} fit")
            if fit:
                ax.plot([fit], [fit * context * case.kv_bytes_per_token / GB], "o", color=colour)
        ax.axhline(case.left / GB, color="black", lw=1.2)
        ax.text(1, case.left / GB * 1.15, f"left for the KV cache: {case.left / GB:.1f} GB = {MEMORY_SHARE:.0%} "
                f"of {case.memory / GB:.1f} GB - {case.weight_bytes / GB:.2f} GB of weights", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("requests in flight (each with its own KV cache)")
        ax.set_ylabel("KV cache (GB)")
        ax.set_title(f"{case.label}\nKV cache: {case.kv_bytes_per_token / 1e3:.1f} kB per token", fontsize=9.5)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("How many users fit: each request's KV cache is bytes per token x its context; the memory the weights "
                 "leave caps the sum\n(the dots: the most requests that fit at that context; 90% of the memory is the "
                 "server's, as vLLM's default gpu_memory_utilization; lessons 03 and 09)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return cases

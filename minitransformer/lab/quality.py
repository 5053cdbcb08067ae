"""Measuring what quantization costs: perplexity, KL vs float32, top-1 and greedy agreement, memory, decode speed.

Quantization lowers memory and bandwidth (quantize/); whether the answers stay the same has to be measured on text,
not assumed. The corpus needs no download: the docstrings of ~50 Python standard-library modules (~300 KB of English
with code, in a fixed order), read from this interpreter. Every setting is compared with the float32 model on the same
tokens, window by window:

    perplexity   exp(mean negative log-likelihood of each next token)          lower is better
    KL           mean over positions of KL(p_float32 || p_setting), in nats    0 = the same distributions
    top-1        fraction of positions whose most likely next token is float32's
    greedy       greedy continuations of prompts, 64 tokens: tokens identical to float32's before the first
                 difference, as a fraction (after a difference the two texts no longer line up)

Lesson 13 prints these as one table with the memory of weights and KV cache and the decode speed.
"""

from __future__ import annotations

import importlib
import inspect
import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from ..core.backend import synchronize, to_host
from ..core.decode import decode_step
from ..core.kv_cache import KVCache
from ..core.metrics import now
from ..core.prefill import prefill

CORPUS_MODULES = tuple("""abc argparse ast asyncio base64 bisect calendar collections contextlib copy csv dataclasses
    datetime decimal difflib enum fractions functools glob hashlib heapq html http.client inspect itertools json logging
    math os pathlib pickle queue random re shutil socket statistics string struct subprocess tempfile textwrap threading
    time timeit typing unittest urllib.parse uuid zipfile""".split())
GREEDY_PROMPTS = ("The three most important ideas in computer science are",
                  "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                  "Once upon a time, in a small village by the sea,")


def stdlib_corpus(modules=CORPUS_MODULES) -> str:
    """The docstrings of `modules` and of their public members (sorted by name), joined by blank lines."""
    parts = []
    with warnings.catch_warnings():                       # typing.io & co. warn when touched; we only read docs
        warnings.simplefilter("ignore", DeprecationWarning)
        for name in modules:
            module = importlib.import_module(name)
            parts.append(inspect.getdoc(module) or "")
            for attr in sorted(dir(module)):
                obj = getattr(module, attr)
                if not attr.startswith("_") and getattr(obj, "__module__", None) == module.__name__:
                    parts.append(inspect.getdoc(obj) or "")
    return "\n\n".join(p for p in parts if p)


def corpus_ids(tokenizer, n: int, corpus: str | None = None) -> list[int]:
    """The first n tokens of the corpus: of its first 8n characters, doubled until they hold n tokens (encoding all
    300 KB takes a while; the scored text is then the same for a given n, which is what comparisons need)."""
    text = stdlib_corpus() if corpus is None else corpus
    chars = 8 * n
    while True:
        ids = tokenizer.encode(text[:chars])
        if len(ids) > n or chars >= len(text):
            return ids[:n]
        chars *= 2


def log_softmax(logits):
    """logits (..., V) -> log-probabilities (..., V), in float64 on the host (the statistics, not the model)."""
    x = to_host(logits).astype(np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def window_logits(model, ids, storage: str = "f32"):
    """All next-token logits (T, V) of one window of ids, run as a prompt through a KV cache stored as `storage`
    (a codec of kv_storage.CODECS): the keys and values come back from the cache, so an int8 cache's rounding is in
    the result (float32 storage gives exactly the logits of a forward without a cache)."""
    cache = KVCache(model.config, len(ids), xp=model.xp, storage=storage)
    return prefill(model, ids, cache, all_logits=True)[0]


@dataclass
class Scores:
    """Running sums over the predicted positions of the corpus; the table's columns are properties."""
    positions: int = 0
    nll: float = 0.0
    kl: float = 0.0
    top1: int = 0
    greedy_same: list = field(default_factory=list)   # per prompt: tokens equal to float32's before the first change
    greedy_total: int = 0
    decode_tokens: int = 0
    decode_seconds: float = 0.0

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.positions)

    @property
    def mean_kl(self) -> float:
        return self.kl / self.positions

    @property
    def top1_agreement(self) -> float:
        return self.top1 / self.positions

    @property
    def greedy_agreement(self) -> float:
        return sum(self.greedy_same) / self.greedy_total

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")


def score_corpus(settings: dict, ids: list[int], window: int = 256) -> dict[str, Scores]:
    """settings: name -> (model, KV storage: a codec name of kv_storage.CODECS); the first is the reference
    (float32 weights and cache).

    The corpus ids are cut into windows of `window` tokens, each run on its own (its first token is context only).
    """
    scores = {name: Scores() for name in settings}
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            break
        targets = np.asarray(chunk[1:])                                              # (T-1,)
        reference = None
        for name, (model, storage) in settings.items():
            logp = log_softmax(window_logits(model, chunk, storage))[:-1]            # (T-1, V)
            if reference is None:
                reference = logp
            s = scores[name]
            s.positions += len(targets)
            s.nll -= float(logp[np.arange(len(targets)), targets].sum())
            s.kl += float((np.exp(reference) * (reference - logp)).sum())
            s.top1 += int((logp.argmax(-1) == reference.argmax(-1)).sum())
    return scores


def greedy(model, prompt_ids: list[int], n: int, storage: str = "f32") -> tuple[list[int], float]:
    """n greedy tokens after the prompt through the stages (prefill, decode_step) -> (tokens, seconds of the n - 1
    decode steps), the keys and values stored as `storage` (a codec name of kv_storage.CODECS)."""
    cache = KVCache(model.config, len(prompt_ids) + n, xp=model.xp, storage=storage)
    tokens = [int(to_host(prefill(model, prompt_ids, cache)).argmax(-1)[0])]
    start = now()
    for _ in range(n - 1):
        tokens.append(int(to_host(decode_step(model, [tokens[-1]], cache)).argmax(-1)[0]))
    synchronize(model.xp)
    return tokens, now() - start


def score_greedy(settings: dict, scores: dict[str, Scores], prompts: list[list[int]], n: int = 64) -> None:
    """Add greedy agreement and decode speed to `scores`, for the same settings as score_corpus."""
    reference: dict[int, list[int]] = {}                 # prompt index -> the first setting's (float32) tokens
    for name, (model, storage) in settings.items():
        s = scores[name]
        for i, prompt in enumerate(prompts):
            tokens, seconds = greedy(model, prompt, n, storage)
            expected = reference.setdefault(i, tokens)
            s.greedy_same.append(next((j for j, (a, b) in enumerate(zip(tokens, expected)) if a != b), n))
            s.greedy_total += n
            s.decode_tokens += n - 1
            s.decode_seconds += seconds

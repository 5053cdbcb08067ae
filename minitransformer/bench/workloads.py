"""Our own side of `minitransformer bench`: each workload is one pure measurement returning seconds or tokens/s.

Definitions (the markdown footnotes of bench.md repeat them; peers.py measures the same things on the peers):

    prefill_seconds(ids)         seconds of prefill.prefill on a fresh KVCache for this P-token prompt -> P / s tok/s
    decode_tok_s(B, ids, N)      KVCache(batch=B), B copies of the prompt prefilled (not timed), then N greedy
                                 decode_step calls with the argmax taken on the host: B * N / decode seconds
    generate_seconds(ids, N, c)  generate() end to end for N new tokens, greedy, ignore_eos, with or without the cache
                                 -> (seconds, token ids): the tokens must be equal with and without the cache
    continuous_tok_s(prompts, N) all prompts at once through Engine(policy="continuous", max_num_seqs=len(prompts)):
                                 every generated token over the wall time, prefill included (scripts/bench_serving.py)

`Ours` wraps a loaded model behind the same method names as the peers (peers.py) so run.py treats all alike.
Each method times one call of its workload (`timed`, on measure.py's clock), leaving out what it must set up first (a
fresh cache, the prefill before decode). The warm-up and the repeats are run.py's: its rounds call ours and the peers
in turns, so one slow spell of the machine hits every system alike.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ..core.backend import synchronize, to_host
from ..core.decode import decode_step
from ..core.generate import generate
from ..core.kv_cache import KVCache
from ..core.prefill import prefill
from ..core.sampling_params import SamplingParams
from ..lab.measure import time_calls
from ..no_cache import RecomputeRunner

# A real text for the prompts (>= 1024 tokens once repeated with variations), cut to each length P.
TEXT = ("The history of the printing press begins in the fifteenth century, when movable metal type changed how "
        "books were made, how much they cost, and who could read them. Printers moved from town to town, carrying "
        "their presses, their fonts and their habits; a city with a press soon had a bookseller, a paper mill and "
        "a school. Within fifty years millions of books were in circulation, and the number of people who could "
        "read grew with them. Scholars compared texts line by line, merchants printed price lists, and governments "
        "printed laws that everyone was expected to know. ")

TOPICS = ["the printing press", "volcanoes", "the history of tea", "how bridges stay up", "honey bees",
          "the moon landing", "bread baking", "ocean tides", "the Roman roads", "electric motors", "chess openings",
          "coral reefs", "the first computers", "glaciers", "paper money", "migrating birds"]

Returned = TypeVar("Returned")     # what the timed call returns


def timed(run: Callable[[], Returned]) -> tuple[float, Returned]:
    """(seconds, what run() returned) of one call, timed by measure.time_calls with no warm-up of its own: the
    caller's rounds (run.alternate) make the warm-up call and the repeats, interleaved with the other systems."""
    out: list[Returned] = []
    timing = time_calls(lambda: out.append(run()), repeats=1, warmup=0)
    return timing.min, out[0]


def prompt_ids(tokenizer, n: int) -> list[int]:
    """The first n tokens of a long real text (numbered paragraphs, so no two stretches are identical)."""
    parts: list[str] = []
    ids: list[int] = []
    while len(ids) < n:
        parts.append(f"Part {len(parts) + 1}. {TEXT}")
        ids = tokenizer.encode("".join(parts))
    return ids[:n]


def serving_prompts(n: int) -> list[str]:
    """Prompts of mixed lengths: a short question, or the same with a longer preamble for every third one."""
    out = []
    for i in range(n):
        text = f"Write a short paragraph about {TOPICS[i % len(TOPICS)]}."
        if i % 3 == 0:
            text = "You are a patient teacher who explains things to curious students in plain words. " * 2 + text
        out.append(text)
    return out


def greedy(max_tokens: int) -> SamplingParams:
    """Greedy with a fixed output length (no EOS stop), so every system does the same number of steps."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def run_engine(model, prompts: list, params: SamplingParams, policy: str = "continuous"):
    """All requests at once through an Engine -> (wall seconds, their Results in request order, the engine)."""
    from ..serving import Engine

    engine = Engine(model, max_num_seqs=len(prompts), policy=policy)

    def serve_all():
        rids = [engine.add_request(p, params) for p in prompts]
        results = engine.run()
        return [results[rid] for rid in rids]
    seconds, results = timed(serve_all)
    return seconds, results, engine


class Ours:
    """minitransformer itself, measured with the stage functions (prefill.py, decode.py) and the Engine."""
    name = "ours"

    def __init__(self, model):
        self.model = model

    def available(self) -> bool:
        return True

    def supports(self, workload: str, batch: int = 1) -> bool:
        return True

    def prefill_seconds(self, ids: list[int]) -> float:
        model = self.model
        cache = KVCache(model.config, len(ids), xp=model.xp)

        def run():
            to_host(prefill(model, ids, cache))                               # (1, V) logits, on the host
            synchronize(model.xp)
        return timed(run)[0]

    def decode_tok_s(self, batch: int, ids: list[int], new_tokens: int) -> float:
        model = self.model
        cache = KVCache(model.config, len(ids) + new_tokens, batch=batch, xp=model.xp)
        logits = prefill(model, [list(ids)] * batch, cache)                   # (B, V), not timed
        tokens = np.argmax(to_host(logits), axis=-1)                          # (B,)

        def run(tokens=tokens):
            for _ in range(new_tokens):
                logits = decode_step(model, tokens, cache)                    # (B, V)
                tokens = np.argmax(to_host(logits), axis=-1)                  # (B,) greedy, on the host
        seconds, _ = timed(run)
        return batch * new_tokens / seconds

    def generate_seconds(self, ids: list[int], new_tokens: int, use_cache: bool) -> tuple[float, list[int]]:
        runner = None if use_cache else RecomputeRunner
        seconds, out = timed(lambda: generate(self.model, ids, greedy(new_tokens), runner=runner))
        return seconds, list(out.token_ids)

    def continuous_tok_s(self, prompts: list, new_tokens: int) -> float:
        seconds, results, _ = run_engine(self.model, prompts, greedy(new_tokens))
        return sum(len(r.token_ids) for r in results) / seconds

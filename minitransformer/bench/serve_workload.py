"""What `bench serve` asks every server, and when: the settings, the prompts and the Poisson arrival times.

Kept apart from the HTTP client (serve.py) so the workload can be read, and reused, without the networking: the
same prompts at the same arrival times are what make two servers' numbers comparable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from importlib.resources import files

import numpy as np

from ..lab.engine_load import poisson_gaps

ENDPOINTS = ("completions", "chat")        # POST /v1/completions or /v1/chat/completions


@dataclass(frozen=True)
class ServeSettings:
    """What every server is asked, identical across servers and rates so their numbers compare."""

    rates: tuple[float, ...] = (1.0, 2.0, 4.0)
    num_prompts: int = 32
    max_concurrency: int | None = None
    seed: int = 0
    endpoint: str = "completions"            # one of ENDPOINTS
    max_tokens: int = 48
    temperature: float = 0.0
    ignore_eos: bool = False
    model: str | None = None                 # None: the first model GET /v1/models lists
    timeout_s: float = 300.0
    slo_ttft_ms: float = 1000.0
    slo_tpot_ms: float = 100.0
    slo_e2el_ms: float | None = None
    # Each prompt's length in words is drawn from these, so that prefill work varies from request to request as it
    # does in real traffic: short chat-like questions next to long documents.
    prompt_words: tuple[int, ...] = (16, 64, 200)


def make_prompts(n: int, seed: int, lengths: tuple[int, ...] = ServeSettings.prompt_words,
                 round: int = 0) -> list[str]:
    """n slices of the shipped text, their lengths in words drawn from `lengths`; `round` r of a run gets the same
    lengths as every other round but starts that no other round of the run uses.

    Why distinct starts: every server here keeps a prefix cache (ours, llama-server's prompt cache, vLLM's prefix
    caching), so a prompt sent a second time skips most of its prefill. When each rate re-sent the first rate's
    prompts, the second rate hit the cache for ~95% of its prompt tokens (our server's /metrics: 3840 hits of the
    ~4000 prompt tokens), and every rate after the first looked about twice as fast as the first. Here each prompt
    of a run starts at its own word of the text (a shuffle of the start words, dealt out round by round), so no two
    prompts share their first block of tokens until the text's words are used up (542 starts: 16 rounds of 32).
    """
    words = shipped_words()
    rng = random.Random(seed)
    starts = list(range(len(words)))
    rng.shuffle(starts)                                    # first, so a round's starts do not depend on n's draws
    sizes = [rng.choice(lengths) for _ in range(n)]
    first = round * n
    return [" ".join(words[(starts[(first + i) % len(starts)] + j) % len(words)] for j in range(size))
            for i, size in enumerate(sizes)]


def shipped_words() -> list[str]:
    """The words of the text every prompt is a slice of (serve_text.txt); each one can start a prompt."""
    return files(__package__).joinpath("serve_text.txt").read_text(encoding="utf-8").split()


def distinct_rounds(n: int) -> int:
    """How many rounds of n prompts make_prompts deals before a prompt's start repeats an earlier one's (16 of 32):
    past that, a run's later prompts share their first tokens with its earlier ones, and every server's prefix
    cache skips part of their prefill."""
    return len(shipped_words()) // n


def arrival_times(rate: float, n: int, seed: int) -> np.ndarray:
    """Seconds after the start at which each request is sent: the first at 0, then the cumulated gaps."""
    gaps = poisson_gaps(rate, n, seed)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else gaps

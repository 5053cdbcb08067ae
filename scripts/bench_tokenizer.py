"""Benchmark of BPE on one long word (a benchmark, not a test: these machines are shared and noisy).

    python scripts/bench_tokenizer.py [--model PATH] [--lengths 4000 16000 32000] [--seed 0]

A word without spaces or digits is one pre-token, so BPE merges all of it at once: this is where a merge loop that
rescans the word after every merge (O(n^2)) shows, and where the heap of candidate pairs (bpe.py, O(n log n)) keeps
the time near-linear. Prints, for one random lowercase word of each length (seeded, so every run times the same
words):
- the time of `tokenizer.encode(word)` with an empty word cache, and the tokens it gives;
- the ratio of each time to the first one's, beside the ratio of the lengths (linear: the two are equal);
- the time to refuse a prompt of the longest length that cannot fit the context (`make_request` stops tokenizing once
  the prompt has more tokens than the context leaves room for).
Each time goes through measure.time_calls: a warm-up, then --repeats runs (the word cache emptied before each); the
fastest is shown with the median and spread, and the ratios divide fastest by fastest.
"""

from __future__ import annotations

import argparse
import os
import random
import string
import sys
from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from minitransformer import SamplingParams, load_tokenizer
from minitransformer.core.errors import InputError
from minitransformer.core.generate import make_request
from minitransformer.lab.measure import Timing, time_calls


def random_word(length: int, rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))


def time_encode(tokenizer, text: str, repeats: int = 3) -> tuple[Timing, int]:
    """Seconds to encode `text` from scratch (the word cache would otherwise answer a repeated word at once; emptying
    it is inside the timed call, and costs nothing next to the encoding)."""
    ids = []

    def encode():
        tokenizer._cache.clear()
        ids[:] = tokenizer.encode(text)
    return time_calls(encode, repeats=repeats), len(ids)


def time_refusal(tokenizer, text: str, context_length: int, repeats: int = 3) -> tuple[Timing, str]:
    """Seconds until make_request refuses `text` as too long for the context, and its message."""
    model = SimpleNamespace(tokenizer=tokenizer, config=SimpleNamespace(context_length=context_length))
    messages = []

    def refuse():
        tokenizer._cache.clear()
        try:
            make_request(model, text, SamplingParams(max_tokens=16))
        except InputError as e:
            messages.append(str(e))
            return
        raise SystemExit(f"a {len(text)}-letter prompt fit in a context of {context_length} tokens: nothing refused")
    return time_calls(refuse, repeats=repeats), messages[-1]


def seconds(t: Timing) -> str:
    return f"{t.min:.3f} (median {t.median:.3f}, spread {t.spread:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", metavar="PATH", help="a GGUF whose tokenizer to time (default: the default model)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[4000, 16000, 32000], metavar="N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=8192, help="context length of the refusal test")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure after a warm-up")
    args = parser.parse_args()

    tokenizer = load_tokenizer(args.model)
    rng = random.Random(args.seed)
    words = [random_word(n, rng) for n in args.lengths]

    table = Table(title=f"BPE on one random word per length (seed {args.seed})", title_justify="left")
    for column in ("letters", "tokens", "seconds: fastest (median, spread)", "time ratio", "length ratio"):
        table.add_column(column, justify="right")
    first = None
    for word in words:
        timing, n_tokens = time_encode(tokenizer, word, args.repeats)
        first = first or (timing.min, len(word))
        table.add_row(f"{len(word):,}", f"{n_tokens:,}", seconds(timing), f"{timing.min / first[0]:.1f}x",
                      f"{len(word) / first[1]:.1f}x")
    console = Console()
    console.print(table)
    timing, message = time_refusal(tokenizer, words[-1], args.context, args.repeats)
    console.print(f"refusing the {len(words[-1]):,}-letter prompt in a {args.context}-token context: "
                  f"{seconds(timing)} s\n  {message}")


if __name__ == "__main__":
    main()

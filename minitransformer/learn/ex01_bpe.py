"""Exercise 01: BPE, the tokenizer's merge step: one pre-token's byte characters -> the vocabulary pieces."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..core import bpe as bpe_module, tokenizer as tokenizer_module
from ..core.tokenizer import BYTE_TO_CHAR
from .track import CheckFailed, Exercise, greedy_ids, plugged, real_model, reference_ids, same_tokens

ENGINE_BPE = bpe_module.bpe          # kept at import: a check plugs the learner's function over the engine's name
# Words that exercise the merges, as the tokenizer hands them over (each byte as its GPT-2 character, so a space is
# "Ġ" and "é" is "Ã©"): common words, long words, digits, code, accents, an emoji, runs of one letter (ties).
WORDS = tuple("".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8")) for word in (
    " capital", " France", " Paris", " the", " unbelievably", " internationalization", "12345", " 2024", "def",
    " __init__", " =", " café", " Zürich", "aaaaaaa", " lowest", " 🍽", " !!!!!"))
TEXTS = ("The capital of France is", "Tokenizers split unbelievably long words like internationalization.",
         "def __init__(self): return 2024 * x", "Café au lait in Zürich costs 4.50 CHF 🍽!!!")
# Toy merges where the classic mistakes give different pieces: (left, right) -> rank, smallest merges first.
TOY = {("a", "a"): 0, ("l", "o"): 1, ("lo", "w"): 2, ("e", "r"): 3, ("low", "er"): 4, ("w", "e"): 5, ("x", "e"): 6}
TOY_WORDS = ("aaa", "aaaa", "lower", "lowest", "xer", "x", "")


# ------------------------------------------------------------------------------ the classic mistakes, on purpose

def _merge_until_done(symbols: list[str], ranks, choose) -> list[str]:
    """Merge again and again the adjacent listed pair that choose([(rank, position), ...]) picks, until none."""
    symbols = list(symbols)
    while listed := [(ranks[a, b], i) for i, (a, b) in enumerate(zip(symbols, symbols[1:])) if (a, b) in ranks]:
        i = choose(listed)
        symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]
    return symbols


def _first_listed_pair(symbols, ranks):
    return _merge_until_done(symbols, ranks, lambda listed: listed[0][1])


def _largest_rank(symbols, ranks):
    return _merge_until_done(symbols, ranks, lambda listed: max(listed, key=lambda p: (p[0], -p[1]))[1])


def _rightmost_tie(symbols, ranks):
    return _merge_until_done(symbols, ranks, lambda listed: min(listed, key=lambda p: (p[0], -p[1]))[1])


def _one_pass(symbols, ranks):
    out = list(symbols[:1])
    for symbol in symbols[1:]:
        if (out[-1], symbol) in ranks:
            out[-1] += symbol
        else:
            out.append(symbol)
    return out


MISTAKES = (    # in this order: the first whose pieces equal the learner's is named
    ("the leftmost listed pair merges, whatever its rank: the best-ranked pair (smallest rank) must merge first, "
     "wherever it is", _first_listed_pair),
    ("the pair with the largest rank is merged first: the merges list is in training order, so the pair listed "
     "FIRST (the smallest rank) merges first", _largest_rank),
    ("among equal ranks the rightmost pair merges first: the leftmost does ('aaa' with the merge 'a a' gives "
     "'aa', 'a')", _rightmost_tie),
    ("one left-to-right pass: a merge makes new pairs with its neighbours that can merge in turn; repeat until "
     "no adjacent pair is in the merges list", _one_pass),
)


def check(bpe) -> list[str]:
    ranks = real_model().tokenizer.ranks                  # SmolLM2's merges: (left, right) -> rank
    cases = [(list(word), TOY, "the toy merges") for word in TOY_WORDS]
    cases += [(list(word), ranks, "SmolLM2's merges") for word in WORDS]
    for symbols, table, name in cases:
        expected = ENGINE_BPE(list(symbols), table)
        got = bpe(list(symbols), table)
        if got != expected:
            mistake = next((f". Likely mistake: {label}" for label, wrong in MISTAKES
                            if wrong(list(symbols), table) == got), "")
            raise CheckFailed(f"bpe of {''.join(symbols)!r} ({len(symbols)} symbols) with {name}: expected "
                              f"{expected}, got {got!r}{mistake}")
    tokenizer = real_model().tokenizer
    with fresh_cache(tokenizer):
        expected_ids = [tokenizer.encode(text) for text in TEXTS]
    with plugged(tokenizer_module, "bpe", bpe), fresh_cache(tokenizer):
        got_ids = [tokenizer.encode(text) for text in TEXTS]
        for text, want, ids in zip(TEXTS, expected_ids, got_ids):
            if ids != want:
                raise CheckFailed(f"the real tokenizer with your bpe encodes {text!r} as {ids}, the engine's as "
                                  f"{want}")
        generated = greedy_ids("The capital of France is", 12)
    same_tokens("the real model, prompted through your bpe", generated, reference_ids("The capital of France is", 12),
                tokenizer.decode)
    pieces = [tokenizer.decode([i]) for i in got_ids[1]]
    return [f"your bpe ran inside the real tokenizer: {sum(map(len, got_ids))} tokens of {len(TEXTS)} texts, each "
            f"id as the engine's (e.g. {pieces}), and the model prompted through it continued 'The capital of "
            f"France is' with the reference's 12 tokens: {tokenizer.decode(generated)!r}"]


@contextlib.contextmanager
def fresh_cache(tokenizer) -> Iterator[None]:
    """The tokenizer remembers each word's ids: empty that memory before and after, so every word goes through
    the bpe in place now and none of the learner's pieces outlives the check."""
    tokenizer._cache.clear()
    try:
        yield
    finally:
        tokenizer._cache.clear()


EXERCISE = Exercise(
    number=1, name="bpe", title="BPE: the tokenizer's merges", function="bpe",
    solution="minitransformer/core/bpe.py: bpe (called by core/tokenizer.py's _encode_word for every pre-token)",
    question="How does a BPE tokenizer turn a word into tokens, and why can the same text become different tokens "
             "at a prompt's end?",
    lesson="notebooks/01_tokenize_and_prefill.ipynb (ids and pieces); lessons/01_autoregressive_loop.py",
    hints=(
        "Loop: find every adjacent pair (symbols[i], symbols[i + 1]) that is a key of ranks; stop when there is none.",
        "Merge the pair with the SMALLEST rank (listed first); if it occurs more than once, the leftmost. The toy "
        f"merges the check uses first: {TOY}.",
        "Merging replaces two list items by their concatenation: symbols[i:i + 2] = [symbols[i] + symbols[i + 1]]. "
        "Then look again: the new symbol may pair with its neighbours.",
    ),
    check=check, reference=ENGINE_BPE, mistakes=MISTAKES,
)

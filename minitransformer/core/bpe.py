"""The BPE merge step of the tokenizer: one pre-token's symbols -> the vocabulary pieces it is made of.

Why a file of its own: the rule is one sentence ("merge the adjacent pair that comes first in the merges list, again
and again"), but done naively each merge rescans the word, so a long run of letters without spaces costs O(n^2)
and a pasted blob of base64 could stall a request before its length is even checked. Here the candidate pairs wait
in a heap and the symbols form a doubly linked list, so each merge costs O(log n). tokenizer.py calls `bpe` on every
pre-token; the tokenizer lesson (notebook 01) shows the pieces it returns.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping


def bpe(symbols: list[str], ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Merge adjacent symbols of one word, always the listed pair ranked first, until no listed pair is left.

    Among equal ranks (the same pair in several places) the leftmost merges first, as llama.cpp does: "aaa" with the
    merge "a a" gives "aa", "a". The heap holds (rank, position) of every adjacent pair that is in the merges list;
    a merge makes its entries for the two old neighbours stale, and those are skipped when they come out.
    With merges learned by BPE training this gives the same pieces as GPT-2's loop (merge every occurrence of the best
    pair, then look again): a pair holding a merged symbol is always listed after the merge that made it.
    """
    if len(symbols) < 2:
        return symbols
    text = list(symbols)                      # text[i]: the symbol that starts at position i; "" once merged away
    end = len(text)
    following = list(range(1, end + 1))       # following[i]: position of the next live symbol (end: none)
    preceding = list(range(-1, end - 1))      # preceding[i]: position of the previous live symbol (-1: none)
    heap = [(ranks[pair], i) for i, pair in enumerate(zip(text, text[1:])) if pair in ranks]
    heapq.heapify(heap)
    while heap:
        rank, i = heapq.heappop(heap)
        j = following[i] if text[i] else end
        if j == end or ranks.get((text[i], text[j])) != rank:
            continue                          # stale: one of the pair has merged with another neighbour since
        text[i], text[j] = text[i] + text[j], ""
        following[i] = following[j]           # unlink j: the merged symbol keeps the left position
        if following[j] != end:
            preceding[following[j]] = i
        for left in (preceding[i], i):        # the merged symbol forms a new pair with each neighbour
            _push_pair(heap, text, following, left, ranks)
    return [t for t in text if t]


def _push_pair(heap: list, text: list[str], following: list[int], left: int,
               ranks: Mapping[tuple[str, str], int]) -> None:
    """Queue the pair that starts at `left` (if both symbols exist and the merges list has it)."""
    if left < 0 or following[left] == len(text):
        return
    rank = ranks.get((text[left], text[following[left]]))
    if rank is not None:
        heapq.heappush(heap, (rank, left))

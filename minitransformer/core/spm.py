"""The SentencePiece-style encoder (GGUF `tokenizer.ggml.model == "llama"`): text -> token ids by scores.

Why a second encoder: Gemma (and Llama 1/2, Mistral) do not use byte-level BPE. Their vocabulary stores a score per
token instead of a merges list, spaces are written '▁' (U+2581) inside tokens, and a character no token covers is
spelled with byte tokens `<0x00>` ... `<0xFF>`. tokenizer.py cuts control and user-defined tokens out first and
shares everything else (decode, chat); this file only turns one run of plain text into ids.

The algorithm is llama.cpp's `llm_tokenizer_spm_session` (src/llama-vocab.cpp), written anew here:

1. Every space becomes '▁'; with `add_space_prefix` a '▁' also starts each run that begins the text or follows a
   special token (Gemma 3's file sets add_space_prefix to false).
2. Start from single characters. Every adjacent pair whose concatenation is a vocabulary entry is a candidate;
   repeatedly merge the candidate with the highest score (ties: the leftmost), then queue the new symbol's pairs
   with its neighbours. Same heap and linked list as bpe.py, so each merge costs O(log n).
3. Each final symbol is a vocabulary entry (a merge only makes entries), or a single character the vocabulary lacks:
   that one is written as its UTF-8 bytes' `<0xXX>` tokens (the byte fallback).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

SPACE = "\u2581"  # '▁', the space inside SentencePiece tokens


class SentencePieceEncoder:
    """Plain text -> ids with a scored vocabulary; built once per tokenizer (tokenizer.py)."""

    def __init__(self, token_to_id: Mapping[str, int], scores: Sequence[float], add_space_prefix: bool):
        self.token_to_id = token_to_id
        self.scores = scores
        self.add_space_prefix = add_space_prefix
        self.byte_ids = [byte_token(token_to_id, b) for b in range(256)]   # byte value -> its token id (or None)

    def encode(self, text: str, after_special: bool) -> list[int]:
        """One run of plain text (no special tokens in it) -> ids. after_special: the run starts the text or follows
        a special token, where llama.cpp adds the space prefix."""
        if self.add_space_prefix and after_special:
            text = " " + text
        ids: list[int] = []
        for symbol in merge_by_score(text.replace(" ", SPACE), self.token_to_id, self.scores):
            token_id = self.token_to_id.get(symbol)
            if token_id is not None:
                ids.append(token_id)
            else:       # byte fallback; a byte with no token is dropped (llama.cpp would stop with an error)
                ids.extend(i for i in map(self.byte_ids.__getitem__, symbol.encode("utf-8")) if i is not None)
        return ids


def byte_token(token_to_id: Mapping[str, int], value: int) -> int | None:
    """The token of one byte: `<0xXX>`, else the one-character token of that byte if there is one (llama.cpp's
    byte_to_token does the same)."""
    token_id = token_to_id.get(f"<0x{value:02X}>")
    if token_id is None and value < 0x80:
        token_id = token_to_id.get(chr(value))
    return token_id


def merge_by_score(text: str, vocab: Mapping[str, int], scores: Sequence[float]) -> list[str]:
    """Characters of `text` -> the symbols left after merging, best score first, every adjacent pair that is a
    vocabulary entry.

    The heap holds (-score, left position, right position, merged length): the highest score pops first, and among
    equal scores the leftmost pair, as llama.cpp's comparator orders them. An entry is stale once either symbol has
    changed since it was queued: merged away into its left neighbour (empty), or grown (the lengths no longer add
    up).
    """
    symbols = list(text)                     # symbols[i]: the symbol starting at character i; "" once merged away
    end = len(symbols)
    following = list(range(1, end + 1))      # following[i]: position of the next live symbol (end: none)
    preceding = list(range(-1, end - 1))     # preceding[i]: position of the previous live symbol (-1: none)
    heap: list[tuple[float, int, int, int]] = []
    for left in range(end - 1):
        _push_pair(heap, symbols, left, left + 1, vocab, scores)
    heapq.heapify(heap)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        if not (symbols[left] and symbols[right]) or len(symbols[left]) + len(symbols[right]) != size:
            continue                          # stale
        symbols[left], symbols[right] = symbols[left] + symbols[right], ""
        following[left] = following[right]    # unlink `right`: the merged symbol keeps the left position
        if following[right] != end:
            preceding[following[right]] = left
        if preceding[left] >= 0:
            _push_pair(heap, symbols, preceding[left], left, vocab, scores, push=heapq.heappush)
        if following[left] != end:
            _push_pair(heap, symbols, left, following[left], vocab, scores, push=heapq.heappush)
    return [s for s in symbols if s]


def _push_pair(heap: list, symbols: list[str], left: int, right: int, vocab: Mapping[str, int],
               scores: Sequence[float], push=list.append) -> None:
    """Queue the pair (left, right) if their concatenation is a vocabulary entry."""
    merged = symbols[left] + symbols[right]
    token_id = vocab.get(merged)
    if token_id is not None:
        push(heap, (-scores[token_id], left, right, len(merged)))

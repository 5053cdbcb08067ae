"""Comparing our token ids with llama.cpp's: shared by the BPE (test_tokenizer.py) and SentencePiece
(test_tokenizer_spm.py) tests, for the golden fixtures and the live comparisons."""

from __future__ import annotations

import random

# Code point blocks the live comparisons draw random characters from.
BLOCKS = [(0x20, 0x7E), (0xA0, 0x2FFF), (0x3000, 0x9FFF), (0x1F300, 0x1FAFF), (0, 0xD7FF), (0xE000, 0x10FFFF)]


def mismatches(tokenizer, rows) -> list[str]:
    """One readable entry per row whose ids from `tokenizer` differ from the row's (llama.cpp's) ids."""
    bad = []
    for row in rows:
        ours = tokenizer.encode(row["text"], special=row["special"])
        if ours != row["ids"]:
            bad.append(f"text={row['text']!r} special={row['special']}\n  ours  ={ours}\n  theirs={row['ids']}")
    return bad


def live_rows(llm, rng: random.Random, extra: list[str], n: int = 500) -> list[dict]:
    """n random strings (400 random characters plus `extra` pieces) with llama.cpp's ids (llm: a llama_cpp.Llama
    opened with vocab_only=True); special=True for about 30% of them."""
    alphabet = [chr(rng.randint(*rng.choice(BLOCKS))) for _ in range(400)] + extra
    rows = []
    for _ in range(n):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        special = rng.random() < 0.3
        rows.append({"text": text, "special": special,
                     "ids": llm.tokenize(text.encode("utf-8"), add_bos=False, special=special)})
    return rows

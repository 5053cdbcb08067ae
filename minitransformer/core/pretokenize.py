"""The pre-tokenizer: text -> words, the pieces BPE then merges one at a time (tokenizer.py, step 2).

Why a step of its own: BPE never merges across a word's border, so these regexes decide where tokens can begin.
They must be llama.cpp's exactly, down to its Unicode version, or the ids differ from the reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import regex

# GPT-2's pre-tokenizer: contractions, letters, numbers, other symbols (each with one optional leading space),
# then whitespace. `\s+(?!\S)` leaves the last space of a run to start the next word: "a   b" -> "a", "  ", " b".
GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# tokenizer.ggml.pre -> the regexes llama.cpp applies, one after the other (llama-vocab.cpp).
PRE_TOKENIZERS = {
    "gpt2": [GPT2_REGEX],
    "smollm": [r"\p{N}", GPT2_REGEX],
    "starcoder": [r"\p{N}", GPT2_REGEX],
}

# llama.cpp's character tables are Unicode 15.1; the `regex` module's are newer. Letters and digits added since
# (Unicode 16 and 17: Garay, Egyptian hieroglyphs ext. A, CJK ext. J, ...) are unassigned, i.e. symbols, to llama.cpp,
# so we take them out of \p{L} and \p{N}. Found by tokenizing every code point with both (rare in real text).
NEWER_THAN_LLAMACPP = (
    r"\u0558\u058B-\u058C\u088F\u0C5C\u0CDC\u1C89-\u1C8A\u208F\u209D-\u209F\uA7CB-\uA7CF\uA7D2\uA7D4\uA7DA-\uA7F1"
    r"\uAB6C-\uAB6D\U000105C0-\U000105F3\U000107BB-\U000107BF\U00010940-\U00010959\U00010D40-\U00010D85"
    r"\U00010EC2-\U00010EEE\U00011380-\U000113D3\U000116D0-\U000116E3\U00011B0A-\U00011BF9\U00011DB0-\U00011DF1"
    r"\U0001246F-\U0001247F\U00012550-\U00012686\U00013460-\U000143FA\U00016100-\U00016139\U00016D40-\U00016D79"
    r"\U00016EA0-\U00016ED3\U00016FF2-\U00016FF6\U000187F8-\U000187FF\U00018CD6-\U00018CFF\U00018D09-\U000191D2"
    r"\U0001B123-\U0001B128\U0001B168\U0001CCF0-\U0001CCF9\U0001D6A6\U0001DF1F-\U0001DF24\U0001DF2B-\U0001DFFF"
    r"\U0001E5D0-\U0001E6FF\U0002B73A-\U0002B73F\U0002B81E\U0002CEA2-\U0002CEAD\U000323B0-\U0003FC3F"
)


def compile_like_llamacpp(pattern: str) -> regex.Pattern:
    """Compile a pre-tokenizer regex with llama.cpp's (Unicode 15.1) idea of what a letter and a number are."""
    for cls in (r"\p{L}", r"\p{N}"):
        pattern = pattern.replace(cls, f"[{cls}--[{NEWER_THAN_LLAMACPP}]]")  # `--`: set difference (regex.V1)
    return regex.compile(pattern, regex.V1)


def split_by(pattern: regex.Pattern, pieces: list[str]) -> list[str]:
    """Split every piece into the regex's matches *and* the gaps between them (llama.cpp keeps both)."""
    out = []
    for piece in pieces:
        start = 0
        for m in pattern.finditer(piece):
            if m.start() > start:
                out.append(piece[start : m.start()])
            out.append(m.group())
            start = m.end()
        if start < len(piece):
            out.append(piece[start:])
    return out


def pre_tokenize(text: str, patterns: Sequence[regex.Pattern]) -> list[str]:
    """Text -> words. Each regex splits the pieces the previous one left, so no word crosses a digit."""
    pieces = [text]
    for pattern in patterns:
        pieces = split_by(pattern, pieces)
    return pieces

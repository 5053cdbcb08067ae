"""Exercise 10: UTF-8-safe streaming: how many of the bytes so far can be shown as text now."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, cast

import numpy as np

from ..core import detokenizer
from ..core.generate import stream
from ..core.sampling_params import SamplingParams
from .track import CheckFailed, Exercise, likely_mistake, plugged, real_model

# IncrementalDetokenizer's own decoder (errors="replace"), made once here: stage 2 swaps the detokenizer's for yours
ENGINE_DECODER = detokenizer.IncrementalDetokenizer(None)._decoder


def complete_prefix_reference(data: bytes) -> int:
    """What the engine's detokenizer decodes now: the bytes its incremental UTF-8 decoder does not keep waiting.
    Its decoder, fed `data` at once; getstate() names the bytes it holds for a character not finished yet."""
    decoder = ENGINE_DECODER
    decoder.reset()
    decoder.decode(bytes(data))
    waiting, _ = decoder.getstate()
    return len(data) - len(waiting)


class LearnerDecoder:
    """An incremental UTF-8 decoder built on the learner's complete_prefix: what the detokenizer calls instead of
    Python's (decode(data, final) -> text, reset()). Bytes past the complete prefix wait for the next call."""

    def __init__(self, complete_prefix: Callable[[bytes], int]):
        self.complete_prefix, self.waiting = complete_prefix, b""

    def decode(self, data: bytes, final: bool = False) -> str:
        buffer = self.waiting + bytes(data)
        n = len(buffer) if final else int(self.complete_prefix(buffer))
        if not 0 <= n <= len(buffer):
            raise CheckFailed(f"complete_prefix({buffer!r}) returned {n}, outside [0, {len(buffer)}]")
        self.waiting = buffer[n:]
        return buffer[:n].decode("utf-8", errors="replace")

    def reset(self) -> None:
        self.waiting = b""


# ------------------------------------------------------------------------------- the classic mistakes, on purpose

def _everything(data):
    return len(data)


def _one_byte(data):
    return len(data) - 1 if complete_prefix_reference(data) < len(data) else len(data)


MISTAKES = (
    ("every byte is decoded at once (errors='replace'), so a character split across tokens comes out as U+FFFD; "
     "the bytes of an unfinished character must wait", _everything),
    ("only the last byte is held back; an unfinished character can have 1 to 3 bytes so far (a 4-byte emoji often "
     "arrives as 2 + 1 + 1): hold back from its first byte", _one_byte),
)
OVER_PREFIXES = tuple((label, lambda prefixes, wrong=wrong: [wrong(p) for p in prefixes]) for label, wrong in MISTAKES)

TEXTS = ("café", "3 € each", "pizza 🍕!", "中文 ok", "🍽🍽", "aé€🍕")   # 1-, 2-, 3- and 4-byte characters
EMOJI_PROMPT = "Write a short message with a pizza emoji."          # lesson 06's; greedy: emoji of 2 + 1 + 1 bytes
TOKENS = 9


def _stream(model) -> list[str]:
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    return [delta.text for delta in stream(model, EMOJI_PROMPT, params, chat=True)]


@functools.cache
def _expected_deltas() -> tuple[str, ...]:
    return tuple(_stream(real_model()))


def check(complete_prefix) -> list[str]:
    for text in TEXTS:
        data = text.encode()
        prefixes = [data[:cut] for cut in range(len(data) + 1)]
        got = [int(complete_prefix(p)) for p in prefixes]
        expected = [complete_prefix_reference(p) for p in prefixes]
        if got != expected:
            cut = next(i for i, (g, e) in enumerate(zip(got, expected)) if g != e)
            raise CheckFailed(f"complete_prefix({prefixes[cut]!r}) (the first {cut} bytes of {text!r}): expected "
                              f"{expected[cut]}, got {got[cut]}"
                              + likely_mistake(np.asarray(got), (prefixes,), OVER_PREFIXES, 0, 0))

    # stage 2: the real loop streams an emoji reply with the detokenizer decoding through your function
    model = real_model()
    engine_deltas = _expected_deltas()
    learner_codecs = SimpleNamespace(getincrementaldecoder=lambda encoding: (
        lambda errors="strict": LearnerDecoder(complete_prefix)))        # what the detokenizer asks of `codecs`
    with plugged(detokenizer, "codecs", cast(Any, learner_codecs)):
        deltas = _stream(model)
    broken = [d for d in deltas if "\ufffd" in d]
    if broken or "".join(deltas) != "".join(engine_deltas):
        named = MISTAKES[0][0] if broken else ""           # U+FFFD streamed: a split character was decoded
        raise CheckFailed(f"the real loop streaming the reply to {EMOJI_PROMPT!r} through your complete_prefix: "
                          f"expected the deltas {list(engine_deltas)!r}, got {deltas!r}"
                          + (f". Likely mistake: {named}" if named else ""))
    text = "".join(deltas)
    held = sum(1 for d in deltas if d == "")
    return [f"stage 1: complete_prefix equals the engine's decoder on every prefix of {len(TEXTS)} texts "
            f"({sum(len(t.encode()) + 1 for t in TEXTS)} byte strings)",
            f"stage 2: the real model's {TOKENS}-token reply to {EMOJI_PROMPT!r} streamed through your function as "
            f"{deltas!r}: {text!r}, the engine's text, no U+FFFD; {held} of {len(deltas)} deltas were empty, tokens "
            f"that ended inside a character"]


EXERCISE = Exercise(
    number=10, name="detokenizer", title="UTF-8-safe incremental detokenization", function="complete_prefix",
    solution="minitransformer/core/detokenizer.py: IncrementalDetokenizer.add_token (its incremental UTF-8 decoder "
             "keeps an unfinished character's bytes until the rest arrives)",
    question="Why can't a server print each token's text as it arrives, and what must a streaming detokenizer hold "
             "back?",
    lesson="lessons/06_stopping_and_streaming.py (section 2: the pizza-emoji reply, token by token)",
    hints=(
        "UTF-8: a byte 0xxxxxxx is a whole character; 110xxxxx starts a 2-byte one, 1110xxxx 3 bytes, 11110xxx 4; "
        "10xxxxxx continues one.",
        "Only the last character can be unfinished: walk back from the end over at most 3 continuation bytes to the "
        "byte that starts it, and see whether all of its bytes are there.",
        "If they are not, return the index of that first byte (everything before it decodes); else len(data).",
    ),
    check=check, reference=complete_prefix_reference, mistakes=MISTAKES,
)

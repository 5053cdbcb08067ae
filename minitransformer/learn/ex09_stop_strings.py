"""Exercise 09: stop strings: find one the new text completed, and hold back what could still become one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ..core import stopping
from ..core.detokenizer import IncrementalDetokenizer
from ..core.generate import stream
from ..core.sampling_params import SamplingParams
from .track import CheckFailed, Exercise, plugged, real_model

ENGINE_FIND = stopping.find_stop_string                   # the engine's own, kept: stage 2 plugs yours in its place
ENGINE_HELD_BACK = IncrementalDetokenizer.held_back


def held_back_reference(text: str, pending: int, stops) -> int:
    """IncrementalDetokenizer.held_back with the exercise's signature: `text` so far, of which the last `pending`
    characters are not streamed yet."""
    detok = IncrementalDetokenizer(None, stops)
    detok.text, detok._emitted = text, len(text) - pending
    return ENGINE_HELD_BACK(detok)


# ------------------------------------------------------------------------------- the classic mistakes, on purpose

def _only_new(text, new_chars, stops):
    return ENGINE_FIND(text[len(text) - new_chars:], new_chars, stops) if new_chars else None


def _end_index(text, new_chars, stops):
    found = ENGINE_FIND(text, new_chars, stops)
    return None if found is None else (found[0] + len(found[1]), found[1])


def _list_order(text, new_chars, stops):
    for stop in stops:
        start = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if start != -1:
            return start, stop
    return None


FIND_MISTAKES: tuple[tuple[str, Callable], ...] = (
    ("only the new characters are searched, so a stop string that straddles two tokens is missed; search from "
     "len(text) - new_chars - len(stop) + 1", lambda t, n, s: _only_new(t, n, s)),
    ("the index returned is where the stop string ends; it is where it starts (the text is cut there)",
     _end_index),
    ("the first stop string in list order wins; the engine takes the one that starts earliest in the text (then "
     "the shorter)", _list_order),
)
HOLD_MISTAKES: tuple[tuple[str, Callable], ...] = (
    ("nothing is held back: a stop string's first half is streamed before the token that completes it arrives",
     lambda text, pending, stops: 0),
    ("a fixed window of max(len(stop)) - 1 characters is held back; hold back only the longest suffix of the "
     "unstreamed text that is a proper prefix of a stop string",
     lambda text, pending, stops: min(pending, max((len(s) - 1 for s in stops), default=0))),
)
MISTAKES = FIND_MISTAKES + HOLD_MISTAKES

FIND_CASES: tuple[tuple[tuple[Any, ...], str], ...] = (   # (text, new_chars, stops), what each one exercises
    (("The answer is 4. The end", 3, ("The end",)), "a stop string that straddles two tokens"),
    (("Paris. The", 4, (". T", "Paris")), "a stop string ending inside the new characters"),
    (("one two three", 6, ("four",)), "no stop string"),
    (("a foo bar", 4, ("bar", "foo bar")), "two stop strings completed by the same token"),
    (("xx abc", 4, ("abc", "ab")), "two stop strings starting at the same place"),
)
HOLD_CASES: tuple[tuple[tuple[Any, ...], str], ...] = (   # (text, pending, stops), what each one exercises
    (("This classic mat", 10, ("math problem",)), "the start of a stop string at the end"),
    (("This classic mat", 2, ("math problem",)), "only 2 characters unstreamed"),
    (("Hello world", 5, ("ab", "xyz")), "nothing that could begin a stop string"),
    (("say a ", 4, ("ab", "a b", "xyz")), "two stop strings that could begin here, one longer"),
)

QUESTION = "What is 2+2?"                 # greedy SmolLM2: "The answer to this classic math problem is 4."
STOP = "math problem"                     # two tokens, " math" and " problem" (lesson 06's stop string)


def _same(what: str, got, expected, inputs, mistakes) -> None:
    got = tuple(got) if isinstance(got, list) else got
    if got == expected:
        return
    named = next((label for label, wrong in mistakes if wrong(*inputs) == got), None)
    raise CheckFailed(f"{what}: expected {expected!r}, got {got!r}"
                      + (f". Likely mistake: {named}" if named else ""))


def _companion(find_stop_string) -> Callable:
    """The held_back written in the same file as find_stop_string (the engine's, for the engine's reference)."""
    if find_stop_string is ENGINE_FIND:
        return held_back_reference
    held_back = getattr(find_stop_string, "__globals__", {}).get("held_back")
    if not callable(held_back):
        raise CheckFailed("your file has no function held_back(); the exercise asks for it next to find_stop_string")
    return held_back


def _stream(question: str, stop: str) -> tuple[list[str], Any]:
    """The chat reply's deltas and Result, greedy, with one stop string."""
    params = SamplingParams(max_tokens=24, temperature=0.0, stop=(stop,))
    deltas = list(stream(real_model(), question, params, chat=True))
    return [d.text for d in deltas], deltas[-1].result


@functools.cache
def _expected_stream(question: str, stop: str):
    return _stream(question, stop)


def check(find_stop_string) -> list[str]:
    held_back = _companion(find_stop_string)
    for inputs, what in FIND_CASES:
        _same(f"find_stop_string{inputs!r} ({what})", find_stop_string(*inputs), ENGINE_FIND(*inputs), inputs,
              FIND_MISTAKES)
    try:
        for inputs, what in HOLD_CASES:
            _same(f"held_back{inputs!r} ({what})", held_back(*inputs), held_back_reference(*inputs), inputs,
                  HOLD_MISTAKES)
    except NotImplementedError:
        raise CheckFailed("find_stop_string passes; held_back() is not written yet: its body still raises "
                          "NotImplementedError") from None

    # stage 2: the real loop with both plugged in, streaming a chat reply with a stop string
    expected_deltas, expected = _expected_stream(QUESTION, STOP)

    def held(detok):
        return held_back(detok.text, len(detok.text) - detok._emitted, detok.stop)

    with plugged(stopping, "find_stop_string", find_stop_string), \
            plugged(IncrementalDetokenizer, "held_back", held):
        try:
            deltas, result = _stream(QUESTION, STOP)
        except ValueError as exc:         # the detokenizer refuses to cut text it already streamed
            raise CheckFailed(f"the real loop with your functions, stop {STOP!r}: {exc}. Likely mistake: "
                              f"{HOLD_MISTAKES[0][0]}") from None
    got = (result.text, result.finish_reason, result.stop_reason)
    want = (expected.text, expected.finish_reason, expected.stop_reason)
    if got != want:
        raise CheckFailed(f"the real loop with your functions, chat {QUESTION!r} with stop {STOP!r}: expected text, "
                          f"finish_reason, stop_reason {want!r}, got {got!r}")
    if deltas != expected_deltas:
        raise CheckFailed(f"the real loop with your functions streamed {deltas!r}; the engine streams "
                          f"{expected_deltas!r}")
    return [f"stage 1: {len(FIND_CASES)} find_stop_string cases and {len(HOLD_CASES)} held_back cases equal the "
            f"engine's",
            f"stage 2: the real model's reply to {QUESTION!r} with stop {STOP!r} stopped as the engine's does: "
            f"text {result.text!r}, finish_reason {result.finish_reason!r}, stop_reason {result.stop_reason!r}, "
            f"streamed as {deltas!r} (the stop string's first half held back, never shown)"]


EXERCISE = Exercise(
    number=9, name="stop_strings", title="Stop strings and the hold-back", function="find_stop_string",
    solution="minitransformer/core/stopping.py: find_stop_string (called by check_stop); "
             "minitransformer/core/detokenizer.py: IncrementalDetokenizer.held_back (called by take_delta)",
    question="How does a server stop on a stop sequence when tokens and text do not line up, and what must it hold "
             "back while streaming?",
    lesson="lessons/06_stopping_and_streaming.py (section 1: the three ways to stop; the stop string 'math problem')",
    hints=(
        "A stop string can begin in earlier text and end in the new characters: search text from "
        "max(0, len(text) - new_chars - len(stop) + 1), with str.find.",
        "Return (start, stop): the index where it starts, since the text is cut there. With several, the earliest "
        "start wins, then the shorter one.",
        "held_back: for k from min(len(stop) - 1, pending) down to 1, if text.endswith(stop[:k]) that stop needs "
        "k characters held; return the largest k over the stops (0 when none).",
    ),
    check=check, reference=ENGINE_FIND, mistakes=MISTAKES,
)

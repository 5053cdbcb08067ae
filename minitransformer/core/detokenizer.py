"""Incremental, UTF-8-safe detokenizer: token ids -> streamed text, one token at a time.

Why it is here: the model produces tokens, the user reads characters, and the two do not line up. A byte-level BPE
token is a run of *bytes*: an emoji (4 bytes) often arrives as 2 or 3 tokens, and printing each token's bytes on its
own would show "\ufffd\ufffd" where the emoji should be. So the loop hands every new token to this stage, which

1. appends the token's bytes to an incremental UTF-8 decoder: complete characters go to `text`, the bytes of an
   unfinished character wait inside the decoder until the rest arrives (an invalid byte becomes U+FFFD as soon as it
   is known to be invalid -- the same text `bytes.decode(errors="replace")` gives for the whole output);
2. streams the part of `text` not yet shown, minus a tail that might still turn into a stop string. That tail is
   the longest suffix of `text` that is a proper prefix of some stop string (llama.cpp's rule in its server), not a
   fixed window of max(len(stop)) - 1 characters: with stop "ab", "xyz" streams at once and only "a" waits.

Order in the loop (generate.py), after each new token:

    new_chars = detok.add_token(token)            # this stage
    decision = check_stop(..., detok, new_chars)  # stopping.py: the one place that decides to stop
    if decision: detok.truncate(decision.truncate_to) when set, then detok.take_delta(final=True)
    else:        detok.take_delta()

Invariant: the concatenation of all deltas == the final `text`; without a stop that cut it, that is
`tokenizer.decode(output_ids, skip_special=True)`. The streaming lesson shows it; tests/test_detokenizer.py checks it.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class IncrementalDetokenizer:
    """One request's output text, built token by token; `text` holds every complete character so far."""

    def __init__(self, tokenizer, stop: Sequence[str] | None = (), skip_special: bool = True):
        self.tokenizer = tokenizer
        self.stop = tuple(stop or ())
        self.skip_special = skip_special
        self.text = ""
        self._emitted = 0            # characters of `text` already returned by take_delta
        self.last_token_bytes = 0    # bytes the last add_token contributed (0 for a skipped control token)
        # Python's incremental decoder keeps the bytes of an unfinished character between calls and replaces an
        # invalid byte exactly where a one-shot decode of all the bytes would (Unicode's "maximal subpart" rule).
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add_token(self, token_id: int) -> int:
        """Append one token; return how many characters `text` grew by (the stop-string search window needs it).

        Control tokens (`<|im_end|>`, ...) add nothing when skip_special, as vLLM's skip_special_tokens=True.
        A token that only starts a character returns 0; the token that completes it returns 1 (or more).
        """
        if self.skip_special and token_id in self.tokenizer.control_ids:
            self.last_token_bytes = 0
            return 0
        data = self.tokenizer.token_bytes(token_id)
        self.last_token_bytes = len(data)
        new = self._decoder.decode(data)
        self.text += new
        return len(new)

    def truncate(self, length: int) -> None:
        """Cut `text` to `length` characters (a stop string or stop token was found) and drop unfinished bytes.

        The bytes still in the decoder come after the cut, so they are discarded, not flushed as U+FFFD.
        Cutting into text already streamed would break "deltas add up to the text": that is a bug in the caller
        (take_delta called between add_token and the stop check), so it raises.
        """
        if not self._emitted <= length <= len(self.text):
            raise ValueError(f"cannot truncate the text to {length} characters: it has {len(self.text)}, "
                             f"of which {self._emitted} were already streamed")
        self.text = self.text[:length]
        self._decoder.reset()

    def take_delta(self, final: bool = False) -> str:
        """The text not returned yet, except a tail that could be the start of a stop string.

        final=True (the request is over) flushes everything, unfinished bytes included (each becomes U+FFFD).
        """
        if final:
            self.text += self._decoder.decode(b"", final=True)
            end = len(self.text)
        else:
            end = len(self.text) - self.held_back()
        delta = self.text[self._emitted : end]
        self._emitted = end
        return delta

    def held_back(self) -> int:
        """Length of the longest suffix of the unstreamed text that is a proper prefix of some stop string.

        Proper: a whole stop string at the end is not held here; the stop check finds it and cuts it instead.
        Cost: at most sum(len(stop)) suffix comparisons per token -- stop strings are short.
        """
        pending = len(self.text) - self._emitted
        best = 0
        for stop in self.stop:
            for k in range(min(len(stop) - 1, pending), best, -1):   # longest first; stop at a shorter best
                if self.text.endswith(stop[:k]):
                    best = k
                    break
        return best

"""The stop rules, all in one place: after each new token, is this request finished, and why?

Why it is here: "when do we stop" looks trivial and is where servers disagree most. Keeping every rule in one
function, in one fixed order, makes finish_reason / stop_reason a single decision that lessons and tests can read.
The order is vLLM v1's, checked after each new token, once it has been detokenized. The stop_reason "eos" below is
ours: vLLM leaves stop_reason None when EOS ends a request, and our HTTP server reports null there as vLLM does.

0. the constraint failed        -> "abort", stop_reason "constraint" (a structured-output constraint that reached a
                                   limit while the request ran: TokenMask.error says which; it cannot go on)
1. min_tokens not reached       -> no stop at all (the sampler also masks EOS and the stop ids: tokens_to_suppress),
                                   unless the structured-output constraint is complete (no token could follow)
2. EOS, unless ignore_eos       -> "stop", stop_reason "eos"
3. a stop_token_ids token       -> "stop", stop_reason = that id (its text is cut, as EOS's would be)
4. a stop string in the text    -> "stop", stop_reason = that string; the text is cut at its start
                                   (or after its end with include_stop_str_in_output)
5. the constraint is complete   -> "stop", stop_reason "structured" (nothing but EOS could follow: vLLM spends one
                                   more step sampling that EOS; we stop at once)
6. max_tokens or context full   -> "length", stop_reason None (with a constraint: Result.structured says whether
                                   the output completed it)

A stop string is searched in the *detokenized* text, because tokens and strings do not line up: "France is" is
two tokens, " France" and " is", and no single token contains it. Only the window the new characters can complete
is searched: from len(text) - new_chars - len(stop) + 1. Earlier text was searched at earlier tokens, so each
occurrence is found exactly once, at the token that completes it, and the cost per token does not grow with the
output. Nor with a client's appetite: SamplingParams caps the stop strings (MAX_STOP_STRINGS, MAX_STOP_CHARS) and
stop_token_ids, so a token's stop check costs at most one search per string in a window of that string's length.
Before each step the loop also calls check_abort (timeout, cancel -> "abort").
Lengths are counted in token ids (len(output_ids)), never by re-encoding the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .detokenizer import IncrementalDetokenizer
from .metrics import now


@dataclass(frozen=True)
class StopDecision:
    """Why a request finished.

    finish_reason  stop_reason
    "stop"         "eos"            the model produced its end-of-sequence token
    "stop"         int              a token of params.stop_token_ids (the id)
    "stop"         str              a string of params.stop (the string)
    "stop"         "structured"     the structured-output constraint is complete (structured/)
    "length"       None             max_tokens reached, or the context window is full
    "abort"        "timeout" | "cancelled"
    "abort"        "constraint"     the structured-output constraint failed (Result.structured["error"] says why)

    vLLM leaves stop_reason None for EOS; we say "eos" so a learner reading a result sees what happened.
    truncate_to: cut the text to this many characters (the caller calls detok.truncate), or None to keep it.
    """
    finish_reason: str
    stop_reason: object
    truncate_to: int | None = None


# How the OpenAI-compatible API reports a decision (server/responses.py), beside the rules that make it: every pair
# not listed passes through as it is. vLLM reports null for EOS and, after a completed constraint, for the EOS it
# samples next; a request past --request-timeout is "length": OpenAI clients read that as "cut short by a limit",
# which is what happened, and keep the partial text. A client never sees "abort" for its own disconnect.
API_REASONS: dict[tuple[str, object], tuple[str, object]] = {
    ("stop", "eos"): ("stop", None),
    ("stop", "structured"): ("stop", None),
    ("abort", "timeout"): ("length", "timeout"),
}


def api_reasons(finish_reason: str, stop_reason: object) -> tuple[str, object]:
    """(finish_reason, stop_reason) as the HTTP API reports them (API_REASONS)."""
    key = (finish_reason, stop_reason)
    return API_REASONS.get(key, key) if isinstance(stop_reason, (str, type(None))) else key


def check_stop(params, detok: IncrementalDetokenizer, output_ids: Sequence[int], new_chars: int, eos_id: int | None,
               prompt_len: int, context_length: int, constraint=None) -> StopDecision | None:
    """Apply the stop rules after one new token (already in output_ids and in detok.text; it added new_chars).

    Reads params' stop fields and the request's constraint (a TokenMask or None: rule 0 its error, 1 complete).
    """
    if constraint is not None and constraint.error is not None:
        return StopDecision("abort", "constraint")
    complete = constraint is not None and constraint.complete
    num_output = len(output_ids)
    if num_output < params.min_tokens and not complete:
        return None                       # vLLM v1 (scheduler check_stop): no stop check at all before min_tokens
    last = output_ids[-1]
    text_len = len(detok.text)
    # The stop token's own text is cut too, unless include_stop_str_in_output: vLLM v0's StopChecker removes the
    # last new_char_count characters, v1's detokenizer skips the token (vllm/v1/engine/detokenizer.py). EOS adds
    # none when special tokens are skipped. If the token completed a character begun earlier, that goes as well;
    # if it only began one (new_chars == 0), truncate() drops the unfinished bytes, so no U+FFFD is left behind.
    cut_token = None if params.include_stop_str_in_output or detok.last_token_bytes == 0 else text_len - new_chars
    if not params.ignore_eos and eos_id is not None and last == eos_id:
        return StopDecision("stop", "eos", cut_token)
    if last in params.stop_token_ids:
        return StopDecision("stop", last, cut_token)
    found = find_stop_string(detok.text, new_chars, params.stop)
    if found is not None:
        start, stop = found
        return StopDecision("stop", stop, start + len(stop) if params.include_stop_str_in_output else start)
    if complete:
        return StopDecision("stop", "structured")
    if num_output >= params.max_tokens or prompt_len + num_output >= context_length:
        return StopDecision("length", None)
    return None


def find_stop_string(text: str, new_chars: int, stops: Sequence[str]) -> tuple[int, str] | None:
    """The first stop string that the last new_chars characters of text complete: (its start, the string), or None.

    Each stop is searched only where it could end inside the new characters. When several match, the one that
    starts earliest in the text wins (then the shorter one, whose end the text reached first; then list order).
    vLLM instead takes the first in list order; "earliest in the text" is what a reader of the text sees.
    """
    best = None
    for order, stop in enumerate(stops):
        start = text.find(stop, max(0, len(text) - new_chars - len(stop) + 1))
        if start != -1 and (best is None or (start, len(stop), order) < best[:3]):
            best = (start, len(stop), order, stop)
    return None if best is None else (best[0], best[3])


def tokens_to_suppress(params, num_output: int, eos_id: int | None) -> tuple[int, ...]:
    """Token ids the sampler must not draw next (sampling.mask_tokens sets their logits to -inf): EOS and the stop
    ids before min_tokens.

    vLLM's MinTokensLogitsProcessor masks all stop token ids -- EOS too, unless ignore_eos -- while fewer than
    min_tokens tokens have been produced, so the first min_tokens tokens can never be a stop token.
    """
    if num_output >= params.min_tokens:
        return ()
    eos = () if params.ignore_eos or eos_id is None else (eos_id,)
    return tuple(dict.fromkeys((*eos, *params.stop_token_ids)))   # no duplicates, order kept


def check_abort(deadline: float | None, cancelled) -> StopDecision | None:
    """Before each step: past the deadline (on metrics.now()'s clock, the one every request timestamp uses)
    -> timeout; cancel.is_set() -> cancelled."""
    if deadline is not None and now() >= deadline:
        return StopDecision("abort", "timeout")
    if cancelled is not None and cancelled.is_set():
        return StopDecision("abort", "cancelled")
    return None

"""The loop that wires the stages: one request from prompt to finished text.

    tokenize + check -> prefill (fills the KV cache) -> sample -> [detokenize -> stop check -> stream the new text
                     -> decode one token with the cache -> sample] ... -> finalize (usage, metrics, free the cache)

Each stage lives in the file with its name (prefill.py, decode.py, sampling.py, stopping.py, detokenizer.py,
metrics.py) and the per-request part after sampling in request.py (RequestState, which the serving Engine uses too);
this file only calls them in order, so the whole request flow reads top to bottom in `_run`. `stream()` yields the
text as it is produced; `generate()` runs the same loop to the end. Where the logits come from is a *runner*:
CachedRunner (prefill, then one token per step through the KV cache), no_cache.py's RecomputeRunner (the whole
sequence again every step; lesson 04_cache_vs_no_cache compares them) or speculative/'s draft-and-verify runner
(lesson 12_speculative_decoding), which also picks each verified row's token (accept the draft or resample).
`Runner` below is what the loop asks of any of them, so the loop never asks which one it has.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from typing import Protocol

from ..no_cache import RecomputeRunner
from ..speculative import SpeculativeRunner, make_config
from .decode import decode_step
from .errors import InputError
from .kv_cache import KVCache
from .kv_storage import check_storage
from .metrics import now
from .prefill import prefill
from .request import Delta, Request, RequestState, Result, make_request
from .sampling import SamplingParams, request_logprobs
from .stopping import check_abort

__all__ = ["generate", "stream", "make_request", "Request", "Result", "Delta", "Runner", "CachedRunner",
           "make_runner"]


# ---------------------------------------------------------------------------------------------------- public API

def generate(model, prompt, params: SamplingParams | None = None, chat: bool = False, **options) -> Result:
    """Run one request to the end and return its Result (options as for `stream`)."""
    delta: Delta | None = None
    for delta in stream(model, prompt, params, chat, **options):   # noqa: B007 (run to the end; the last delta has the Result)
        pass
    assert delta is not None and delta.result is not None, "a stream ends with the Delta that carries the Result"
    return delta.result


def stream(model, prompt, params: SamplingParams | None = None, chat: bool = False, *, use_cache: bool = True,
           timeout: float | None = None, cancel=None, speculative=None,
           num_speculative_tokens: int = 4, kv_cache: str = "f32") -> Iterator[Delta]:
    """Yield Deltas as tokens are produced. The input is checked here, before any model work, so bad input raises
    InputError at the call; the loop itself starts when iteration does.

    prompt: text, token ids, or (with chat=True) a list of {"role", "content"} messages or one user message.
    timeout: seconds from now after which the request is aborted (finish_reason "abort", stop_reason "timeout").
    cancel: anything with is_set() (a threading.Event); when set, the reply stops with stop_reason "cancelled".
    speculative: "ngram", "self:L" (the first L layers draft), a draft Transformer of the same vocabulary, or a
    speculative.SpeculativeConfig; num_speculative_tokens: the k tokens drafted per target pass. Greedy output is
    the same as without it; sampled output has the same distribution (speculative/).
    kv_cache: how the cache stores keys and values, "f32" or "int8" (kv_storage.py; lesson 13 measures the cost).
    """
    arrival = now()
    check_stream_options(timeout, cancel)
    params = params if params is not None else SamplingParams()
    request = make_request(model, prompt, params, chat, arrival)
    deadline = None if timeout is None else arrival + timeout
    check_storage(kv_cache)
    if kv_cache != "f32" and not use_cache:
        raise InputError(f"kv_cache={kv_cache!r} chooses how the KV cache is stored; use_cache=False (--no-cache) "
                         "keeps no cache")
    if speculative is not None:
        if not use_cache:
            raise InputError("speculative decoding verifies drafts against the KV cache; it cannot run with "
                             "use_cache=False (--no-cache)")
        speculative = make_config(model, speculative, num_speculative_tokens)
    # The request's memory is taken here, at the call, so one that cannot fit is refused before any work: the KV
    # cache for prompt + max_tokens (the runner) and the RoPE table rows for every position it will use.
    runner = make_runner(model, request, use_cache, speculative, kv_cache)
    model.reserve_positions(len(request.prompt_token_ids) + params.max_tokens)
    return _run(model, request, deadline, cancel, runner)


def check_stream_options(timeout, cancel) -> None:
    """timeout a positive number of seconds and cancel an object with is_set(), checked at the call (the loop only
    reads them once iteration has started, far from the caller's line)."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise InputError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
        if not float(timeout) > 0:
            raise InputError(f"timeout must be > 0 seconds, got {timeout}")
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise InputError(f"cancel must have an is_set() method (a threading.Event), got {type(cancel).__name__}")


class Runner(Protocol):
    """What the loop asks of where its logits come from: CachedRunner, no_cache.RecomputeRunner and
    speculative.SpeculativeRunner each provide it.

    first_logits() -> (1, V) after the prompt; next_logits(token) -> (1, V) after it; sample_next(logits, state) ->
    the token for that row (plain sampling, state.sample; the speculative runner may accept a draft instead);
    kv_tokens / kv_bytes: the KV cache held (the Result reports them); release() frees it; report() -> the dict
    Result.speculative carries, or None.
    """

    def first_logits(self): ...

    def next_logits(self, token: int): ...

    def sample_next(self, logits, state: RequestState) -> int: ...

    @property
    def kv_tokens(self) -> int: ...

    @property
    def kv_bytes(self) -> int: ...

    def release(self) -> None: ...

    def report(self) -> dict | None: ...


class CachedRunner:
    """Where the model's logits come from in the normal loop: prefill once, then one token per step via the cache."""

    def __init__(self, model, prompt_ids: list[int], max_tokens: int, storage: str = "f32"):
        self.model, self.prompt_ids = model, prompt_ids
        self.cache = KVCache(model.config, len(prompt_ids) + max_tokens, xp=model.xp, storage=storage)

    def first_logits(self):
        return prefill(self.model, self.prompt_ids, self.cache)             # (1, V)

    def next_logits(self, token: int):
        return decode_step(self.model, [token], self.cache)                 # (1, V)

    def sample_next(self, logits, state: RequestState) -> int:
        return state.sample(logits)

    def report(self) -> None:
        return None

    @property
    def kv_tokens(self) -> int:
        return self.cache.length

    @property
    def kv_bytes(self) -> int:
        return self.cache.bytes_used

    def release(self) -> None:
        self.cache.release()


# ---------------------------------------------------------------------------------------------------- the loop

def make_runner(model, request: Request, use_cache: bool, speculative=None, storage: str = "f32") -> Runner:
    """Where the loop's logits come from: the speculative runner, the KV cache, or the recompute baseline."""
    if speculative is not None:
        return SpeculativeRunner(model, request, speculative, storage)
    if use_cache:
        return CachedRunner(model, request.prompt_token_ids, request.params.max_tokens, storage)
    return RecomputeRunner(model, request.prompt_token_ids)


def _run(model, request: Request, deadline: float | None, cancel, runner: Runner) -> Iterator[Delta]:
    state = RequestState(request, model.tokenizer, model.config.context_length,
                         kv_usage=lambda: (runner.kv_tokens, runner.kv_bytes))
    try:
        state.metrics.mark_scheduled()
        abort = check_abort(deadline, cancel)
        delta = state.finish(abort) if abort is not None else None
        logits = runner.first_logits() if delta is None else None             # prefill: (1, V)
        while delta is None:
            # sample: the plain choice, or (speculative) accept / resample against a draft
            token = runner.sample_next(logits, state)
            logprobs = request_logprobs(logits, [token], [state])[0]          # of the raw logits, as vLLM reports
            delta = state.append(token, logprobs, abort=check_abort(deadline, cancel))   # detokenize, stop checks
            if delta.finish_reason is None:
                yield delta
                logits, delta = runner.next_logits(token), None               # decode: (1, V)
    finally:
        runner.release()                                     # also when the consumer stops iterating early
    assert delta.result is not None, "the Delta that finishes a request carries its Result"
    delta.result.speculative = runner.report()
    yield delta

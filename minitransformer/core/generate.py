"""The loop that wires the stages: one request from prompt to finished text.

    tokenize + check -> prefill (fills the KV cache) -> sample -> [detokenize -> stop check -> stream the new text
                     -> decode one token with the cache -> sample] ... -> finalize (usage, metrics, free the cache)

Each stage lives in the file with its name (prefill.py, decode.py, sampling.py, stopping.py, detokenizer.py,
metrics.py) and the per-request part after sampling in request.py (RequestState, which the serving Engine uses too);
this file only calls them in order, so the whole request flow reads top to bottom in `run_request`. `stream()`
yields the text as it is produced; `generate()` runs the same loop to the end.

Where the logits come from is a *runner*, the plug-in point of this loop: CachedRunner below (prefill, then one
token per step through the KV cache) is the default; `runner=` takes any factory `(model, request, kv_cache) ->
Runner`, such as no_cache.RecomputeRunner (the whole sequence again every step; lesson 04 compares them) or
speculative.speculative_runner("ngram") (draft and verify; lesson 12), which also picks each verified row's token.
`Runner` below is what the loop asks of any of them, so the loop never asks which one it has.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterator
from typing import Protocol

from .decode import decode_step
from .errors import InputError
from .kv_cache import KVCache
from .kv_storage import check_storage
from .metrics import now
from .prefill import prefill
from .request import Delta, Request, RequestState, Result, make_request
from .sampling import request_logprobs
from .sampling_params import SamplingParams
from .stopping import check_abort

__all__ = ["generate", "stream", "run_request", "make_request", "Request", "Result", "Delta", "Runner",
           "RunnerFactory", "CachedRunner"]


# ---------------------------------------------------------------------------------------------------- public API

def generate(model, prompt, params: SamplingParams | None = None, chat: bool = False, **options) -> Result:
    """Run one request to the end and return its Result (options as for `stream`)."""
    delta: Delta | None = None
    for delta in stream(model, prompt, params, chat, **options):   # noqa: B007 (run to the end; the last delta has the Result)
        pass
    assert delta is not None and delta.result is not None, "a stream ends with the Delta that carries the Result"
    return delta.result


def stream(model, prompt, params: SamplingParams | None = None, chat: bool = False, *,
           runner: RunnerFactory | None = None, timeout: float | None = None, cancel=None,
           kv_cache: str = "f32") -> Iterator[Delta]:
    """Yield Deltas as tokens are produced. The input is checked here, before any model work, so bad input raises
    InputError at the call; the loop itself starts when iteration does.

    prompt: text, token ids, or (with chat=True) a list of {"role", "content"} messages or one user message.
    runner: where the logits come from, a RunnerFactory (None: CachedRunner, the KV cache).
    timeout: seconds from now after which the request is aborted (finish_reason "abort", stop_reason "timeout").
    cancel: anything with is_set() (a threading.Event); when set, the reply stops with stop_reason "cancelled".
    kv_cache: how the cache stores keys and values, "f32" or "int8" (kv_storage.py; lesson 13 measures the cost).
    """
    arrival = now()
    check_stream_options(timeout, cancel, runner)
    params = params if params is not None else SamplingParams()
    request = make_request(model, prompt, params, chat, arrival)
    check_storage(kv_cache)
    # The request's memory is taken here, at the call, so one that cannot fit is refused before any work: the KV
    # cache for prompt + max_tokens (the runner) and the RoPE table rows for every position it will use.
    logits_from = (runner or CachedRunner)(model, request, kv_cache)
    model.reserve_positions(len(request.prompt_token_ids) + params.max_tokens)
    return run_request(model, request, logits_from, None if timeout is None else arrival + timeout, cancel)


def check_stream_options(timeout, cancel, runner) -> None:
    """timeout a positive number of seconds, cancel an object with is_set() and runner a factory, checked at the call
    (the loop only reads them once iteration has started, far from the caller's line)."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise InputError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
        if not float(timeout) > 0:
            raise InputError(f"timeout must be > 0 seconds, got {timeout}")
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise InputError(f"cancel must have an is_set() method (a threading.Event), got {type(cancel).__name__}")
    if runner is not None and not callable(runner):
        raise InputError(f"runner must be a factory (model, request, kv_cache) -> Runner, such as "
                         f"no_cache.RecomputeRunner; got {type(runner).__name__}")


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


# What stream(runner=) takes: made once per request, before any model work (its memory checked then).
RunnerFactory = Callable[..., Runner]          # (model, request, kv_cache storage name) -> Runner


class CachedRunner:
    """Where the model's logits come from in the normal loop: prefill once, then one token per step via the cache."""

    def __init__(self, model, request: Request, storage: str = "f32"):
        self.model, self.prompt_ids = model, request.prompt_token_ids
        self.cache = KVCache(model.config, len(self.prompt_ids) + request.params.max_tokens, xp=model.xp,
                             storage=storage)

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

def run_request(model, request: Request, runner: Runner, deadline: float | None = None,
                cancel=None) -> Iterator[Delta]:
    """The loop over one request already made (make_request): its Deltas, the last with the Result. deadline: on
    metrics.now()'s clock; stream() sets it from its timeout."""
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

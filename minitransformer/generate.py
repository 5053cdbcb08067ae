"""The loop that wires the stages: one request from prompt to finished text.

    tokenize + check -> prefill (fills the KV cache) -> sample -> [detokenize -> stop check -> stream the new text
                     -> decode one token with the cache -> sample] ... -> finalize (usage, metrics, free the cache)

Each stage lives in the file with its name (prefill.py, decode.py, sampling.py, stopping.py, detokenizer.py,
metrics.py); this file only calls them in order, so the whole request flow reads top to bottom in `_run`.
`stream()` yields the text as it is produced; `generate()` runs the same loop to the end. With use_cache=False the
same loop runs on no_cache.py's recompute-everything baseline (lesson 04_cache_vs_no_cache compares them), and with
speculative=... on speculative/'s draft-and-verify runner (lesson 12_speculative_decoding), which also picks each
verified row's token (accept the draft or resample) — every other stage is unchanged.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .decode import decode_step
from .detokenizer import IncrementalDetokenizer
from .errors import InputError
from .kv_cache import KVCache
from .metrics import RequestMetrics, Usage, now
from .prefill import prefill
from .sampling import SamplingParams, compute_logprobs, make_generator, sample
from .stopping import StopDecision, check_abort, check_stop, tokens_to_suppress

_request_ids = itertools.count()


@dataclass
class Request:
    """What the loop works on: the prompt as the model sees it, its token ids, and how to sample."""
    request_id: str
    prompt: str | None               # the text after the chat template; None when token ids were given
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float


@dataclass
class Result:
    """A finished request: what generate() returns (`to_dict` is the `--json` object of `minitransformer generate`)."""
    request_id: str
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str               # "stop" | "length" | "abort"
    stop_reason: object              # "eos" | stop token id | stop string | "timeout" | "cancelled" | None
    usage: Usage
    metrics: RequestMetrics
    logprobs: list[dict] | None
    kv_cache_tokens: int             # tokens whose keys/values were held when the request finished
    kv_cache_bytes: int
    speculative: dict | None = None  # drafter, draft/accepted tokens, acceptance rate (speculative decoding only)

    def to_dict(self) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
               "stop_reason": self.stop_reason, "usage": self.usage.to_dict(), "metrics": self.metrics.to_dict(),
               "kv_cache": {"tokens": self.kv_cache_tokens, "bytes": self.kv_cache_bytes}}
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.speculative is not None:
            out["speculative"] = self.speculative
        return out


@dataclass
class Delta:
    """One piece of a streamed reply. The last delta has finish_reason and the whole Result."""
    text: str
    token_ids: list[int]             # tokens produced since the previous delta
    finish_reason: str | None = None
    result: Result | None = None


# ---------------------------------------------------------------------------------------------------- public API

def generate(model, prompt, params: SamplingParams | None = None, chat: bool = False, **options) -> Result:
    """Run one request to the end and return its Result (options as for `stream`)."""
    delta = None
    for delta in stream(model, prompt, params, chat, **options):
        pass
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
    kv_cache: "f32" (KVCache) or "int8" (quantize.Int8KVCache: 3.8x smaller, lesson 13 measures what it costs).
    """
    arrival = now()
    check_stream_options(timeout, cancel)
    params = params if params is not None else SamplingParams()
    request = make_request(model, prompt, params, chat, arrival)
    deadline = None if timeout is None else arrival + timeout
    cache_class = kv_cache_class(kv_cache)
    if kv_cache != "f32" and not use_cache:
        raise InputError(f"kv_cache={kv_cache!r} chooses how the KV cache is stored; use_cache=False (--no-cache) "
                         "keeps no cache")
    if speculative is not None:
        from .speculative import make_config
        if not use_cache:
            raise InputError("speculative decoding verifies drafts against the KV cache; it cannot run with "
                             "use_cache=False (--no-cache)")
        speculative = make_config(model, speculative, num_speculative_tokens)
    # The request's memory is taken here, at the call, so one that cannot fit is refused before any work: the KV
    # cache for prompt + max_tokens (the runner) and the RoPE table rows for every position it will use.
    runner = make_runner(model, request, use_cache, speculative, cache_class)
    model.rope.reserve(len(request.prompt_token_ids) + params.max_tokens)
    return _run(model, request, use_cache, deadline, cancel, speculative, cache_class, runner)


def check_stream_options(timeout, cancel) -> None:
    """timeout a positive number of seconds and cancel an object with is_set(), checked at the call (the loop only
    reads them once iteration has started, far from the caller's line)."""
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            raise InputError(f"timeout must be a number of seconds, got {type(timeout).__name__} {timeout!r}")
        if not timeout > 0:
            raise InputError(f"timeout must be > 0 seconds, got {timeout}")
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise InputError(f"cancel must have an is_set() method (a threading.Event), got {type(cancel).__name__}")


def kv_cache_class(name: str):
    """"f32" -> KVCache, "int8" -> quantize.Int8KVCache (the same constructor and update protocol)."""
    if name == "f32":
        return KVCache
    from .quantize import KV_CACHES                       # quantize/ builds on kv_cache.py, so it is imported late
    if name not in KV_CACHES:
        raise InputError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got {name!r}")
    return KV_CACHES[name]


def make_request(model, prompt, params: SamplingParams, chat: bool = False, arrival: float | None = None) -> Request:
    """Tokenize (through the chat template when chat) and check the request against the model's limits."""
    if not isinstance(params, SamplingParams):
        raise InputError(f"params must be a SamplingParams, got {type(params).__name__}"
                         + (": build one with SamplingParams(**params)" if isinstance(params, dict) else ""))
    tokenizer, context = model.tokenizer, model.config.context_length
    text = None
    room = max(context - params.max_tokens, 0)     # prompt tokens that fit; tokenizing stops soon after, if it must
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if isinstance(prompt, str) and not prompt:
            raise InputError("the prompt is empty; give at least one character")
        text = tokenizer.render_chat(messages)                  # what a human reads; the ids keep contents plain text
        ids = tokenizer.encode_chat(messages, limit=room)
    elif isinstance(prompt, str):
        if not prompt:
            raise InputError("the prompt is empty; give at least one character")
        text = prompt
        ids = tokenizer.encode(text, limit=room)
    else:
        ids = prompt_token_ids(prompt, tokenizer.vocab_size)
    if not ids:
        raise InputError("the prompt has no tokens; give at least one")
    if len(ids) > room and text is not None:       # tokenizing may have stopped early: only a bound is known
        raise InputError(f"prompt (more than {_tokens(room)}) + max_tokens ({params.max_tokens}) exceeds the context "
                         f"length of {context} tokens")
    if len(ids) + params.max_tokens > context:
        raise InputError(f"prompt ({_tokens(len(ids))}) + max_tokens ({params.max_tokens}) = "
                         f"{len(ids) + params.max_tokens} exceeds the context length of {context} tokens")
    outside = [i for i in params.stop_token_ids if i >= tokenizer.vocab_size]
    if outside:
        raise InputError(f"stop token id {outside[0]} is outside the vocabulary [0, {tokenizer.vocab_size})")
    return Request(f"req-{next(_request_ids)}", text, ids, params, arrival if arrival is not None else now())


def prompt_token_ids(prompt, vocab_size: int) -> list[int]:
    """A prompt given as token ids: a list (or 1-D array) of integers in the vocabulary, else one InputError that
    says what was received. bytes are refused although they iterate as integers: they are text not yet decoded."""
    accepted = "a str, a list of token ids, or with chat=True a list of {'role', 'content'} messages"
    if isinstance(prompt, (bytes, bytearray)):
        raise InputError(f"prompt is {type(prompt).__name__}, not text: decode it first (prompt.decode('utf-8')); "
                         f"a prompt is {accepted}")
    if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
        raise InputError(f"prompt token ids must be one sequence (1-D), got an array of shape {prompt.shape}")
    if not isinstance(prompt, (list, tuple, np.ndarray)):
        raise InputError(f"prompt must be {accepted}; got {type(prompt).__name__} {prompt!r:.80}")
    for index, value in enumerate(prompt):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            hint = {str: " (one prompt per call; an Engine takes many)", dict: " (chat messages need chat=True)"}.get(
                type(value), "")
            raise InputError(f"prompt token ids must be integers, got {type(value).__name__} {value!r:.80} at index "
                             f"{index}{hint}; a prompt is {accepted}")
        if not 0 <= value < vocab_size:
            raise InputError(f"prompt token id {value} is outside the vocabulary [0, {vocab_size})")
    return [int(i) for i in prompt]


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"


class CachedRunner:
    """Where the model's logits come from in the normal loop: prefill once, then one token per step via the cache."""

    def __init__(self, model, prompt_ids: list[int], max_tokens: int, cache_class=None):
        self.model, self.prompt_ids = model, prompt_ids
        self.cache = (cache_class or KVCache)(model.config, len(prompt_ids) + max_tokens, xp=model.xp)

    def first_logits(self):
        return prefill(self.model, self.prompt_ids, self.cache)             # (1, V)

    def next_logits(self, token: int):
        return decode_step(self.model, [token], self.cache)                 # (1, V)

    @property
    def kv_tokens(self) -> int:
        return self.cache.length

    @property
    def kv_bytes(self) -> int:
        return self.cache.bytes_used

    def release(self) -> None:
        self.cache.release()


# ---------------------------------------------------------------------------------------------------- the loop

def make_runner(model, request: Request, use_cache: bool, speculative=None, cache_class=None):
    """Where the loop's logits come from: the speculative runner, the KV cache, or the recompute baseline."""
    if speculative is not None:
        from .speculative import SpeculativeRunner
        return SpeculativeRunner(model, request, speculative, cache_class)
    if use_cache:
        return CachedRunner(model, request.prompt_token_ids, request.params.max_tokens, cache_class)
    from .no_cache import RecomputeRunner
    return RecomputeRunner(model, request.prompt_token_ids)


def _run(model, request: Request, use_cache: bool, deadline: float | None, cancel,
         speculative=None, cache_class=None, runner=None) -> Iterator[Delta]:
    params, tokenizer = request.params, model.tokenizer
    runner = runner if runner is not None else make_runner(model, request, use_cache, speculative, cache_class)
    metrics = RequestMetrics(arrival_time=request.arrival_time)
    detokenizer = IncrementalDetokenizer(tokenizer, params.stop)
    generator = make_generator(params.seed)                 # this request's own random stream
    output_ids: list[int] = []
    logprobs = [] if params.logprobs is not None else None
    decision: StopDecision | None = None
    kv_tokens = kv_bytes = 0
    try:
        metrics.mark_scheduled()
        decision = check_abort(deadline, cancel)
        logits = runner.first_logits() if decision is None else None          # prefill: (1, V)
        while decision is None:
            if speculative is None:
                token = _sample_one(logits, request, generator, output_ids, tokenizer.eos_id)
            else:                                   # the same choice, or accept/resample against a draft
                token = runner.sample_next(logits, request, generator, output_ids, tokenizer.eos_id, _sample_one)
            if logprobs is not None:                                          # of the raw logits, as vLLM reports
                logprobs.extend(compute_logprobs(logits, np.asarray([token]), params.logprobs))
            output_ids.append(token)
            metrics.mark_token()
            new_chars = detokenizer.add_token(token)
            decision = (check_stop(params, detokenizer, output_ids, new_chars, tokenizer.eos_id,
                                   len(request.prompt_token_ids), model.config.context_length)
                        or check_abort(deadline, cancel))
            if decision is None:
                yield Delta(detokenizer.take_delta(), [token])
                logits = runner.next_logits(token)                            # decode: (1, V)
        kv_tokens, kv_bytes = runner.kv_tokens, runner.kv_bytes
    finally:
        runner.release()                                     # also when the consumer stops iterating early
    if decision.truncate_to is not None:
        detokenizer.truncate(decision.truncate_to)
    final_text = detokenizer.take_delta(final=True)
    metrics.mark_finished()
    result = Result(request.request_id, request.prompt_token_ids, detokenizer.text, output_ids,
                    decision.finish_reason, decision.stop_reason,
                    Usage(len(request.prompt_token_ids), len(output_ids)), metrics, logprobs, kv_tokens, kv_bytes,
                    runner.stats.to_dict() if speculative is not None else None)
    yield Delta(final_text, output_ids[-1:] if output_ids else [], decision.finish_reason, result)


def _sample_one(logits, request: Request, generator, output_ids: Sequence[int], eos_id: int) -> int:
    """Sample the next token; until min_tokens is reached, EOS and the stop ids cannot be drawn (vLLM's rule)."""
    suppressed = tokens_to_suppress(request.params, len(output_ids), eos_id)
    if suppressed:
        logits = logits.copy()
        logits[:, list(suppressed)] = -float("inf")
    return int(sample(logits, [request.params], [generator], [request.prompt_token_ids], [output_ids])[0])


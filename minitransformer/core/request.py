"""A request's data and state, shared by every loop: generate() (one request), the serving Engine (many) and the
speculative runner (drafted tokens).

    make_request(model, prompt, params)  tokenize (through the chat template when chat) and check the limits -> Request
    RequestState(request, ...)           its output so far: detokenizer, random stream, metrics, logprobs
    state.sample(logits) -> token        this request's next token (sampling.py's pipeline, one row)
    state.append(token, logprobs)        the stages after sampling: record the token's logprobs, detokenize, stop
      -> Delta                           checks, stream the new text; the Delta that finishes the request carries
                                         its Result

Whatever loop produced the token, finishing (the stop rules, cutting a stop string, the 12-field Result) happens here
and only here, so a request's text and finish reason cannot depend on which loop served it.
"""

from __future__ import annotations

import itertools
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .detokenizer import IncrementalDetokenizer
from .errors import InputError
from .metrics import RequestMetrics, Usage, now
from .sampling import make_generator, sample_tokens
from .sampling_params import SamplingParams
from .stopping import StopDecision, check_stop, tokens_to_suppress

_request_ids = itertools.count()


@dataclass
class Request:
    """What a loop works on: the prompt as the model sees it, its token ids, and how to sample."""
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
    structured: dict | None = None   # the constraint's kind, whether it completed, what its masks cost

    def to_dict(self) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
               "stop_reason": self.stop_reason, "usage": self.usage.to_dict(), "metrics": self.metrics.to_dict(),
               "kv_cache": {"tokens": self.kv_cache_tokens, "bytes": self.kv_cache_bytes}}
        if self.logprobs is not None:
            out["logprobs"] = self.logprobs
        if self.speculative is not None:
            out["speculative"] = self.speculative
        if self.structured is not None:
            out["structured"] = self.structured
        return out


@dataclass
class Delta:
    """What one step produced for one request, whichever loop ran it (generate's stream, the Engine's step, the
    server's engine thread): the new tokens, their text and their logprob entries. The last delta has finish_reason
    and the whole Result."""
    text: str
    token_ids: list[int]             # tokens produced since the previous delta
    finish_reason: str | None = None
    result: Result | None = None
    logprobs: list[dict] | None = None   # the entries of token_ids (Result.logprobs' format); None: not asked for
    error: str | None = None         # the loop serving the request failed (the server's engine): it ends here


class RequestState:
    """One request's output as it grows, and the stages that follow each sampled token.

    kv_usage() -> (tokens, bytes) of KV cache the request holds, read when it finishes (the Result reports them).
    Invariant: output_ids and the detokenizer's tokens are the same list; once `decision` is set nothing is added.
    """

    def __init__(self, request: Request, tokenizer, context_length: int, kv_usage: Callable[[], tuple[int, int]]):
        params = request.params
        self.request, self.tokenizer, self.context_length, self.kv_usage = request, tokenizer, context_length, kv_usage
        self.detokenizer = IncrementalDetokenizer(tokenizer, params.stop)
        self.generator = make_generator(params.seed)                   # this request's own random stream
        # structured output's matcher (a TokenMask), made against the vocabulary before any model work (a grammar no
        # token sequence can write is an InputError here)
        self.constraint = None if params.structured is None else params.structured.make_mask(tokenizer)
        self.metrics = RequestMetrics(arrival_time=request.arrival_time)
        self.output_ids: list[int] = []
        self.logprobs: list[dict] | None = [] if params.logprobs is not None else None
        self._logprobs_streamed = 0                                     # entries already carried by a Delta
        self.decision: StopDecision | None = None

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def suppressed(self) -> tuple[int, ...]:
        """Token ids the sampler must not draw next: EOS and the stop ids until min_tokens (stopping.py)."""
        return tokens_to_suppress(self.params, len(self.output_ids), self.tokenizer.eos_id)

    def sample(self, logits) -> int:
        """This request's next token from raw logits (1, V): sampling.py's pipeline on one row, with the request's
        own generator and EOS and the stop ids suppressed until min_tokens. The Engine samples many requests in one
        call (sampling.next_tokens), the same pipeline."""
        return int(sample_tokens(logits, [self])[0])

    def append(self, token: int, logprobs: dict | None = None, abort: StopDecision | None = None) -> Delta:
        """The stages after sampling one token: record its logprobs (sampling.request_logprobs' entry, when the
        request asked for them), detokenize, check the stop rules, and stream the new text. The Delta that finishes
        the request carries its Result (finish_reason set). abort: a timeout or cancel noticed now
        (stopping.check_abort), which ends the request after this token unless a stop rule already does."""
        if logprobs is not None and self.logprobs is not None:     # an entry comes only when the request asked
            self.logprobs.append(logprobs)
        self.output_ids.append(token)
        self.metrics.mark_token()
        if self.constraint is not None:
            self.constraint.accept(token)
        new_chars = self.detokenizer.add_token(token)
        decision = check_stop(self.params, self.detokenizer, self.output_ids, new_chars, self.tokenizer.eos_id,
                              len(self.prompt_token_ids), self.context_length, self.constraint) or abort
        if decision is None:
            return Delta(self.detokenizer.take_delta(), [token], logprobs=self._new_logprobs())
        return self.finish(decision, [token])

    def finish(self, decision: StopDecision, new_tokens: Sequence[int] = ()) -> Delta:
        """End the request: cut the text where the decision says, close the metrics, build the Result.
        new_tokens: what the final Delta carries (the token that stopped it; nothing for an abort between tokens)."""
        self.decision = decision
        if decision.truncate_to is not None:
            self.detokenizer.truncate(decision.truncate_to)
        final_text = self.detokenizer.take_delta(final=True)
        self.metrics.mark_finished()
        kv_tokens, kv_bytes = self.kv_usage()
        result = Result(self.request.request_id, self.prompt_token_ids, self.detokenizer.text,
                        list(self.output_ids), decision.finish_reason, decision.stop_reason,
                        Usage(len(self.prompt_token_ids), len(self.output_ids)), self.metrics, self.logprobs,
                        kv_tokens, kv_bytes, structured=None if self.constraint is None else self.constraint.summary())
        return Delta(final_text, list(new_tokens), decision.finish_reason, result, self._new_logprobs())

    def _new_logprobs(self) -> list[dict] | None:
        """The logprob entries no Delta has carried yet (append records each token's entry first)."""
        if self.logprobs is None:
            return None
        new, self._logprobs_streamed = self.logprobs[self._logprobs_streamed:], len(self.logprobs)
        return new


# ---------------------------------------------------------------------------------------------------- checking

def make_request(model, prompt, params: SamplingParams, chat: bool = False, arrival: float | None = None) -> Request:
    """Tokenize (through the chat template when chat) and check the request against the model's limits."""
    if not isinstance(params, SamplingParams):
        raise InputError(f"params must be a SamplingParams, got {type(params).__name__}"
                         + (": build one with SamplingParams(**params)" if isinstance(params, dict) else ""))
    tokenizer, context, text = model.tokenizer, model.config.context_length, None
    if params.max_tokens >= context:
        raise InputError(f"max_tokens ({params.max_tokens}) leaves no room for a prompt in the context length of "
                         f"{context} tokens; at most {context - 1} are allowed", param="max_tokens")
    room = context - params.max_tokens             # prompt tokens that fit; tokenizing stops soon after, if it must
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if isinstance(prompt, str) and not prompt:
            raise InputError("the prompt is empty; give at least one character", param="prompt")
        text = tokenizer.render_chat(messages)                  # what a human reads; the ids keep contents plain text
        ids = tokenizer.encode_chat(messages, limit=room)
    elif isinstance(prompt, str):
        if not prompt:
            raise InputError("the prompt is empty; give at least one character", param="prompt")
        text = prompt
        ids = encode_prompt(tokenizer, text, limit=room)
    else:
        ids = prompt_token_ids(prompt, tokenizer.vocab_size)
    if not ids:
        raise InputError("the prompt has no tokens; give at least one", param="prompt")
    if len(ids) > room and text is not None:       # tokenizing may have stopped early: only a bound is known
        raise InputError(f"prompt (more than {_tokens(room)}) + max_tokens ({params.max_tokens}) exceeds the context "
                         f"length of {context} tokens", param="prompt")
    if len(ids) + params.max_tokens > context:
        raise InputError(f"prompt ({_tokens(len(ids))}) + max_tokens ({params.max_tokens}) = "
                         f"{len(ids) + params.max_tokens} exceeds the context length of {context} tokens",
                         param="prompt")
    outside = [i for i in params.stop_token_ids if i >= tokenizer.vocab_size]
    if outside:
        raise InputError(f"stop token id {outside[0]} is outside the vocabulary [0, {tokenizer.vocab_size})",
                         param="stop_token_ids")
    return Request(f"req-{next(_request_ids)}", text, ids, params, arrival if arrival is not None else now())


def encode_prompt(tokenizer, text: str, limit: int | None = None) -> list[int]:
    """A text's ids as the model reads them: BOS first where the file asks (Gemma; not SmolLM2), then the text's."""
    bos = [tokenizer.bos_id] if tokenizer.add_bos and tokenizer.bos_id is not None else []
    return bos + tokenizer.encode(text, limit=limit)


def prompt_token_ids(prompt, vocab_size: int) -> list[int]:
    """A prompt given as token ids: a list (or 1-D array) of integers in the vocabulary, else one InputError that
    says what was received. bytes are refused although they iterate as integers: they are text not yet decoded."""
    accepted = "a str, a list of token ids, or with chat=True a list of {'role', 'content'} messages"
    if isinstance(prompt, (bytes, bytearray)):
        raise InputError(f"prompt is {type(prompt).__name__}, not text: decode it first (prompt.decode('utf-8')); "
                         f"a prompt is {accepted}", param="prompt")
    if isinstance(prompt, np.ndarray) and prompt.ndim != 1:
        raise InputError(f"prompt token ids must be one sequence (1-D), got an array of shape {prompt.shape}",
                         param="prompt")
    if not isinstance(prompt, (list, tuple, np.ndarray)):
        raise InputError(f"prompt must be {accepted}; got {type(prompt).__name__} {prompt!r:.80}", param="prompt")
    for index, value in enumerate(prompt):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
            hints: dict[type, str] = {str: " (one prompt per call; an Engine takes many)",
                                      dict: " (chat messages need chat=True)"}
            hint = hints.get(type(value), "")
            raise InputError(f"prompt token ids must be integers, got {type(value).__name__} {value!r:.80} at index "
                             f"{index}{hint}; a prompt is {accepted}", param="prompt")
        if not 0 <= int(value) < vocab_size:
            raise InputError(f"prompt token id {value} is outside the vocabulary [0, {vocab_size})", param="prompt")
    return [int(i) for i in prompt]


def _tokens(n: int) -> str:
    return f"{n} token" if n == 1 else f"{n} tokens"

"""SamplingParams: how one request wants its tokens chosen, with vLLM's names, defaults and ranges.

Checked once, when the request is made, so a bad value is one clear InputError before any model work (the CLI
turns it into exit code 2) and the sampler itself (sampling.py) never has to doubt its inputs.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

from .errors import InputError

# vLLM's _SAMPLING_EPS: a temperature below this is greedy (dividing by it would overflow float32 anyway).
GREEDY_TEMPERATURE = 1e-5
# Factors that scale float32 logits must be float32 numbers themselves: past these they round to 0 or inf (and
# a subnormal loses its precision), which would turn logits into inf and the probabilities into NaN.
FLOAT32_MAX = float(np.finfo(np.float32).max)
FLOAT32_TINY = float(np.finfo(np.float32).tiny)             # the smallest normal float32
# vLLM's default max_logprobs: more alternatives per token than this is refused (the whole vocabulary would be 49,152).
MAX_LOGPROBS = 20
# What one request's stop rules may cost. They are checked after every token of that request (stopping.py and the
# detokenizer's hold-back): each stop string is searched in the window the new characters can complete, and each is
# compared against the end of the unstreamed text, so a token costs about one step per stop string plus one per
# character of them all. Unbounded, one client's list slows every request batched with it (a step waits for all
# its sequences' stop checks). OpenAI allows 4 stop strings; vLLM sets no limit, and its users pass a template's
# end markers and a few-shot separator or two. 64 strings of 64 characters each covers that many times over and
# keeps the worst case to a few thousand character comparisons per token, small next to a decode step.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 4096               # all stop strings together
# stop_token_ids are looked up after every token and masked in the logits before min_tokens: a template's end
# tokens are a handful; 64 leaves room for a whole family of them.
MAX_STOP_TOKEN_IDS = 64


@dataclass(frozen=True)
class SamplingParams:
    """vLLM's sampling settings (names, defaults and ranges), validated once when the request is made.

    Invariants after construction: numbers are plain Python ints / floats (a NumPy float64 scalar would silently
    promote float32 logits to float64), `stop` and `stop_token_ids` are tuples, min_tokens <= max_tokens.
    """
    max_tokens: int = 16              # vLLM's default
    min_tokens: int = 0
    temperature: float = 1.0          # 0 (below 1e-5) = greedy
    top_p: float = 1.0                # (0, 1]; 1 = off
    top_k: int = 0                    # 0 or -1 = off, else >= 1
    min_p: float = 0.0                # [0, 1]; 0 = off
    repetition_penalty: float = 1.0   # > 0; prompt + output tokens: logit > 0 ? l / r : l * r
    presence_penalty: float = 0.0     # [-2, 2], output tokens only, once per distinct token
    frequency_penalty: float = 0.0    # [-2, 2], output tokens only, times the token's count
    seed: int | None = None
    stop: tuple[str, ...] = ()        # a list or a single str is accepted too
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    logprobs: int | None = None       # number of top log-probs per generated token

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)    # noqa: E731 (frozen dataclass)
        set_("max_tokens", _integer("max_tokens", self.max_tokens))
        if self.max_tokens < 1:
            raise InputError(f"max_tokens must be at least 1, got {self.max_tokens}")
        set_("min_tokens", _integer("min_tokens", self.min_tokens))
        if self.min_tokens < 0:
            raise InputError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.min_tokens > self.max_tokens:
            raise InputError(f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})")

        temperature = _real("temperature", self.temperature)
        if not temperature >= 0:
            raise InputError(f"temperature must be >= 0, got {_show(self.temperature)}")
        if temperature > FLOAT32_MAX:
            raise InputError(f"temperature must be at most {FLOAT32_MAX:.3g} (float32's largest number; the logits "
                             f"are divided by it in float32), got {_show(self.temperature)}")
        top_p = _real("top_p", self.top_p)
        if not 0 < top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {_show(self.top_p)}")
        top_k = _integer("top_k", self.top_k)
        if top_k < -1:
            raise InputError(f"top_k must be -1, 0 or >= 1, got {top_k}")
        min_p = _real("min_p", self.min_p)
        if not 0 <= min_p <= 1:
            raise InputError(f"min_p must be in [0, 1], got {_show(self.min_p)}")
        repetition_penalty = _real("repetition_penalty", self.repetition_penalty)
        if not repetition_penalty > 0:
            raise InputError(f"repetition_penalty must be > 0, got {_show(self.repetition_penalty)}")
        if not FLOAT32_TINY <= repetition_penalty <= FLOAT32_MAX:
            raise InputError(f"repetition_penalty must be in [{FLOAT32_TINY:.3g}, {FLOAT32_MAX:.3g}] (a normal float32 "
                             f"number: logits are scaled by it in float32), got {_show(self.repetition_penalty)}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = _real(name, getattr(self, name))
            if not -2 <= value <= 2:
                raise InputError(f"{name} must be in [-2, 2], got {_show(getattr(self, name))}")
            set_(name, value)
        set_("temperature", temperature)
        set_("top_p", top_p)
        set_("top_k", top_k)
        set_("min_p", min_p)
        set_("repetition_penalty", repetition_penalty)

        if self.seed is not None:
            seed = _integer("seed", self.seed)
            if seed < 0:
                raise InputError(f"seed must be a non-negative integer, got {seed}")
            set_("seed", seed)

        stop = (self.stop,) if isinstance(self.stop, str) else self.stop
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise InputError(f"stop must be a string or a list of strings, got {self.stop!r}")
        _check_stop_size(stop)          # before the per-character checks below: their cost is what it bounds
        if any(s == "" for s in stop):
            raise InputError("a stop string must not be empty")
        for s in stop:      # undecodable command-line bytes arrive as lone surrogates: text that never matches
            surrogate = next((c for c in s if "\ud800" <= c <= "\udfff"), None)
            if surrogate is not None:
                raise InputError(f"a stop string must be valid Unicode text, got {s!r}: it holds the lone surrogate "
                                 f"U+{ord(surrogate):04X} (bytes that are not UTF-8?), which generated text never "
                                 "contains")
        set_("stop", tuple(stop))

        ids = (self.stop_token_ids,) if _is_int(self.stop_token_ids) else self.stop_token_ids
        if not isinstance(ids, (list, tuple)):
            raise InputError(f"stop_token_ids must be a list of non-negative integers, got {self.stop_token_ids!r}")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise InputError(f"stop_token_ids has {len(ids)} ids; at most {MAX_STOP_TOKEN_IDS} are allowed (each "
                             "is checked after every token)")
        bad = [i for i in ids if not (_is_int(i) and i >= 0)]
        if bad:                     # the entry itself, not the tuple the CLI gathered it into
            raise InputError(f"stop_token_ids must be non-negative integers (token ids), got {_show(bad[0])}")
        set_("stop_token_ids", tuple(int(i) for i in ids))

        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
            set_(name, bool(getattr(self, name)))

        if self.logprobs is not None:
            if not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS:
                raise InputError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {_show(self.logprobs)}")
            set_("logprobs", int(self.logprobs))

    @property
    def greedy(self) -> bool:
        """Take the argmax instead of drawing (temperature 0; vLLM also treats temperature < 1e-5 so)."""
        return self.temperature < GREEDY_TEMPERATURE


def _check_stop_size(stop) -> None:
    """The caps on the stop strings (MAX_STOP_STRINGS, MAX_STOP_CHARS): one InputError naming the cap."""
    if len(stop) > MAX_STOP_STRINGS:
        raise InputError(f"stop has {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed (each is searched "
                         "after every token)")
    total = sum(len(s) for s in stop)
    if total > MAX_STOP_CHARS:
        raise InputError(f"stop strings have {total} characters in all; at most {MAX_STOP_CHARS} are allowed "
                         "(they are compared with the text after every token)")


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _show(value) -> str:
    """A value as the user wrote it: 0 stays "0", a string keeps its quotes."""
    return str(value) if isinstance(value, numbers.Number) else repr(value)


def _integer(name: str, value) -> int:
    if not _is_int(value):
        raise InputError(f"{name} must be an integer, got {_show(value)}")
    return int(value)


def _real(name: str, value) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be a number, got {_show(value)}")
    if math.isinf(value):
        raise InputError(f"{name} must be finite, got {_show(value)}")
    return float(value)         # NaN passes here and fails the range check that follows (NaN compares False)

"""SamplingParams: how one request wants its tokens chosen, with vLLM's names, defaults and ranges.

Checked once, when the request is made, so a bad value is one clear InputError before any model work (the CLI
turns it into exit code 2, the HTTP server into a 400 naming the field) and the sampler itself (sampling.py) never
has to doubt its inputs. SamplingParams is the one validator: the CLI and the server only convert what they read
into these fields and let it check them.

Each field also says how it is offered to users (`option`: the help text, the CLI flag's metavar and name, and
whether the HTTP endpoints take it under its own name), and `sampling_options()` lists them: cli/options.py builds
one flag per field from it and server/protocol.py reads one JSON field per field. A new sampling option is a field
here and its stage in sampling.py; the CLI flag and the HTTP field follow.
"""

from __future__ import annotations

import math
import numbers
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import numpy as np

from .backend import is_int
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


class TokenMask(Protocol):
    """One request's constraint on which token may come next, applied by the sampling stage (sampling.mask_tokens)
    and advanced by every token the loop takes. structured/'s Constraint is one (JSON schema, regex, grammar). A
    constraint that fails while the request runs does not raise: it sets `error`, allows EOS alone, and the stop
    rules end its request (stopping.check_stop), not the batch it runs in."""

    def allowed(self, vocab_size: int) -> Any: ...      # (V,) bool on the host: True where the token may come next

    def accept(self, token: int) -> None: ...           # the loop took this token

    @property
    def complete(self) -> bool: ...                      # nothing but EOS could follow: the request stops (stopping.py)

    @property
    def error(self) -> str | None: ...                   # why it cannot go on (a limit hit): the request ends

    @property
    def masks(self) -> int: ...                          # masks computed so far (the server's /metrics counts them)

    @property
    def mask_s(self) -> float: ...                       # ... and the seconds they took

    def summary(self) -> dict: ...                       # what Result.structured reports


class TokenMaskSpec(Protocol):
    """What SamplingParams.structured holds: a description of a constraint that makes each request its own TokenMask
    (structured.StructuredOutputsParams is one)."""

    @property
    def kind(self) -> str: ...                           # "json", "regex", ...: what Result.structured names

    def make_mask(self, tokenizer) -> TokenMask: ...


def option(help: str, metavar: str | None = None, *, flag: str | None = None, cli_default=None,
           http: bool = True, choices: tuple | None = None) -> dict:
    """A field's metadata: how users reach it. help: the CLI's help text ({default} is the CLI default); metavar:
    the CLI's placeholder; flag: the CLI flag without "--" (default: the name with dashes); cli_default: when the CLI
    defaults otherwise than the library (None: the field's default); http: False when the endpoints read it
    themselves (under other names or with other defaults), True when the JSON field is the field's name; choices:
    the values the flag accepts (the owner's own tuple, e.g. scheduler.POLICIES). serving/engine_args.py's
    EngineArgs describes its fields the same way."""
    return {"help": help, "metavar": metavar, "flag": flag, "cli_default": cli_default, "http": http,
            "choices": choices}


@dataclass(frozen=True)
class SamplingParams:
    """vLLM's sampling settings (names, defaults and ranges), validated once when the request is made.

    Invariants after construction: numbers are plain Python ints / floats (a NumPy float64 scalar would silently
    promote float32 logits to float64), `stop` and `stop_token_ids` are tuples, min_tokens <= max_tokens.
    """
    max_tokens: int = field(default=16, metadata=option(       # vLLM's default
        "most new tokens (default {default})", "N", http=False))
    min_tokens: int = field(default=0, metadata=option("no stop (EOS, stop ids, stop strings) before this many tokens",
                                                       "N"))
    temperature: float = field(default=1.0, metadata=option(   # 0 (below 1e-5) = greedy
        "0 = greedy (the default here, so runs repeat exactly)", "T", cli_default=0.0))
    top_p: float = field(default=1.0, metadata=option(         # (0, 1]; 1 = off
        "keep the smallest set of tokens with this much probability", "P"))
    top_k: int = field(default=0, metadata=option(             # 0 or -1 = off, else >= 1
        "keep the k most probable tokens (0 or -1: off)", "K"))
    min_p: float = field(default=0.0, metadata=option(         # [0, 1]; 0 = off
        "drop tokens below min_p x the top probability", "P"))
    repetition_penalty: float = field(default=1.0, metadata=option(   # > 0; prompt + output: logit > 0 ? l / r : l * r
        "> 1 discourages tokens already in prompt or output", "R"))
    presence_penalty: float = field(default=0.0, metadata=option(     # [-2, 2], output only, once per distinct token
        "subtracted once from every token already generated", "X"))
    frequency_penalty: float = field(default=0.0, metadata=option(    # [-2, 2], output only, times the token's count
        "subtracted per occurrence in the generated tokens", "X"))
    seed: int | None = field(default=None, metadata=option("seed of this request's own random generator", "S"))
    stop: tuple[str, ...] = field(default=(), metadata=option(        # a list or a single str is accepted too
        "stop when the text contains STR (repeatable)", "STR"))
    stop_token_ids: tuple[int, ...] = field(default=(), metadata=option(
        "stop at this token id (repeatable)", "ID", flag="stop-token-id"))
    ignore_eos: bool = field(default=False, metadata=option("keep going past the end-of-sequence token"))
    include_stop_str_in_output: bool = field(default=False, metadata=option("keep the matched stop string in the text"))
    logprobs: int | None = field(default=None, metadata=option(       # top log-probs per generated token
        "report the K most probable tokens at every step", "K", http=False))
    # What the output must match, as a TokenMaskSpec: structured.StructuredOutputsParams (a JSON schema, regex, choice
    # list or grammar). No generic option: the CLI offers it as --json-schema / --regex / --choice, the server as
    # response_format and vLLM's fields.
    structured: TokenMaskSpec | None = None

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)
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
            raise InputError(f"stop must be a string or a list of strings, got {_show(self.stop)}")
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

        given: Any = self.stop_token_ids            # unchecked until here: whatever the caller passed
        ids = (given,) if is_int(given) else given
        if not isinstance(ids, (list, tuple)):
            raise InputError(f"stop_token_ids must be a list of non-negative integers, got "
                             f"{_show(self.stop_token_ids)}")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise InputError(f"stop_token_ids has {len(ids)} ids; at most {MAX_STOP_TOKEN_IDS} are allowed (each "
                             "is checked after every token)")
        bad = [i for i in ids if not (is_int(i) and i >= 0)]
        if bad:                     # the entry itself, not the tuple the CLI gathered it into
            raise InputError(f"stop_token_ids must be non-negative integers (token ids), got {_show(bad[0])}")
        set_("stop_token_ids", tuple(int(i) for i in ids))

        for name in ("ignore_eos", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise InputError(f"{name} must be True or False, got {getattr(self, name)!r}")
            set_(name, bool(getattr(self, name)))

        if self.structured is not None and not callable(getattr(self.structured, "make_mask", None)):
            raise InputError(f"structured must describe a constraint, such as minitransformer.structured."
                             f"StructuredOutputsParams(json=schema); got {type(self.structured).__name__}"
                             + (": StructuredOutputsParams.of(fields) takes a dict" if isinstance(self.structured, dict)
                                else ""))

        if self.logprobs is not None:
            if not is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS:
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


def _show(value, limit: int = 80) -> str:
    """A value as the user wrote it: 0 stays "0", a string keeps its quotes; cut after `limit` characters (a
    client may send a list of a million entries)."""
    text = str(value) if isinstance(value, numbers.Number) else repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _integer(name: str, value) -> int:
    if not is_int(value):
        raise InputError(f"{name} must be an integer, got {_show(value)}")
    return int(value)


def _real(name: str, value) -> float:
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        raise InputError(f"{name} must be a number, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:       # an integer has no size limit (JSON's neither); the sampler computes in floats
        raise InputError(f"{name} must be a number a float can hold, got an integer of {len(str(abs(value)))} "
                         "digits") from None
    if math.isinf(number):
        raise InputError(f"{name} must be finite, got {_show(value)}")
    return number               # NaN passes here and fails the range check that follows (NaN compares False)


# ---------------------------------------------------------------------------------------------------- as options

@dataclass(frozen=True)
class Option:
    """One dataclass field as the CLI (and, for SamplingParams, the HTTP API) offers it, from its `option` metadata
    and its type. kind: the type of one value (int, float, bool, str); repeated: the field holds several (a tuple)."""
    name: str
    kind: type
    repeated: bool
    default: object                  # the CLI's default
    help: str
    metavar: str | None
    flag: str                        # "--top-p"
    http: bool
    choices: tuple | None = None


def options_of(cls) -> list[Option]:
    """Every field of the dataclass `cls` that has `option` metadata, in order: what cli/options.add_options turns
    into flags (SamplingParams here, serving's EngineArgs)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        if "help" not in f.metadata:           # offered under other names (structured)
            continue
        hint = hints[f.name]
        repeated = typing.get_origin(hint) is tuple
        kinds = [a for a in typing.get_args(hint) if a not in (type(None), Ellipsis)]   # int | None -> int
        meta = f.metadata
        default = f.default if meta["cli_default"] is None else meta["cli_default"]
        out.append(Option(f.name, kinds[0] if kinds else hint, repeated, default, meta["help"], meta["metavar"],
                          "--" + (meta["flag"] or f.name.replace("_", "-")), meta["http"], meta["choices"]))
    return out


def sampling_options() -> list[Option]:
    """Every SamplingParams field that has an option, in order (see the module docstring)."""
    return options_of(SamplingParams)

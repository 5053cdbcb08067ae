"""What to speculate with: SpeculativeConfig, checked by make_config from what speculative_runner(...) takes; the
one parser of a drafter's name ("ngram", "self:L", "model") and the check of self:L's L, which the CLI reuses for
--speculative (cli/options.py, which names the flags); and the footer line (lesson 12).

Kept apart from the drafters and the runner so that the CLI can check its flags without loading either. Errors here
name the option (`speculative`), never a CLI flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.errors import InputError

if TYPE_CHECKING:
    from ..core.model import Transformer

MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """What to draft with and how far ahead.  method: "ngram" | "self" | "model"; layers for "self"; draft for
    "model" (a loaded Transformer); k = num_speculative_tokens; ngram sizes tried from ngram_max down to ngram_min."""
    method: str
    k: int = 4
    layers: int = 0
    draft: Transformer | None = None
    ngram_max: int = 4
    ngram_min: int = 1

    @property
    def name(self) -> str:
        return {"ngram": "ngram", "self": f"self:{self.layers}", "model": "model"}[self.method]


def make_config(model, speculative, num_speculative_tokens: int = 4) -> SpeculativeConfig:
    """"ngram", "self:L", a draft Transformer, or a SpeculativeConfig -> a checked SpeculativeConfig."""
    if isinstance(speculative, SpeculativeConfig):
        config = speculative
    elif hasattr(speculative, "forward") and hasattr(speculative, "config"):
        config = SpeculativeConfig("model", num_speculative_tokens, draft=speculative)
    else:
        parsed = parse_method(speculative) if isinstance(speculative, str) else None
        if parsed is None or parsed[0] == "model":          # "model" names a drafter; here the model itself is due
            raise InputError(f"speculative must be 'ngram', 'self:L' or a draft model, got {speculative!r}")
        method, layers = parsed
        config = SpeculativeConfig(method, num_speculative_tokens, layers=layers)
    if isinstance(config.k, bool) or not isinstance(config.k, int) or not 1 <= config.k <= MAX_SPECULATIVE_TOKENS:
        raise InputError(f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
                         f"got {config.k!r}")
    if config.method == "self":
        check_layers(config.layers, model.config.n_layers)
    if config.method == "model":
        if config.draft is None:
            raise InputError("speculative method 'model' needs a draft model (SpeculativeConfig(draft=...))")
        check_same_vocabulary(model, config.draft)
    return config


def parse_method(name: str) -> tuple[str, int] | None:
    """A drafter's name -> (method, L): "ngram" -> ("ngram", 0), "model" -> ("model", 0), "self:L" -> ("self", L);
    None for any other name (the caller says what it accepts). An L that is not a number is an InputError."""
    if name in ("ngram", "model"):
        return name, 0
    if not name.startswith("self:"):
        return None
    layers = name[len("self:"):]
    if not layers.isdigit():
        raise InputError(f"speculative self:L needs a number of layers L >= 1, got {name!r}")
    return "self", int(layers)


def check_layers(layers: int, n_layers: int | None) -> None:
    """self:L drafts with the model's first L layers, so 1 <= L < n_layers (n_layers None, the model not loaded
    yet: only L >= 1)."""
    if layers < 1 or (n_layers is not None and layers >= n_layers):
        top = "" if n_layers is None else (f" and < {n_layers} (the first L layers of this {n_layers}-layer model "
                                           f"draft: L must be in [1, {n_layers - 1}])")
        raise InputError(f"speculative self:L needs a number of layers L >= 1{top}, got 'self:{layers}'")


def describe(stats: dict) -> str:
    """One line for the CLI footer: how the drafts fared."""
    rate = stats["acceptance_rate"]
    return (f"speculative {stats['method']} k={stats['num_speculative_tokens']}: {stats['accepted_tokens']}/"
            f"{stats['draft_tokens']} drafts accepted ({'-' if rate is None else f'{rate:.0%}'}), "
            f"{stats['tokens_per_target_pass']:.2f} tokens per target pass")


def check_same_vocabulary(model, draft) -> None:
    """A draft model must spell every token id the same way, or its guesses would mean other words."""
    ours, theirs = model.tokenizer.tokens, draft.tokenizer.tokens
    if ours != theirs:
        differ = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise InputError(f"the draft model's vocabulary differs from the model's ({len(theirs)} vs {len(ours)} "
                         f"tokens, first difference at id {differ}); a draft model must share the tokenizer")

"""What to speculate with: SpeculativeConfig, checked by make_config from what generate(speculative=...) takes, and
the CLI's side (checking --speculative / --draft-model, the footer line; cli/options.py loads a draft model) (lesson 12).

Kept apart from the drafters and the runner so that the CLI can check its flags without loading either.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError

MAX_SPECULATIVE_TOKENS = 16


@dataclass(frozen=True)
class SpeculativeConfig:
    """What to draft with and how far ahead.  method: "ngram" | "self" | "model"; layers for "self"; draft for
    "model" (a loaded Transformer); k = num_speculative_tokens; ngram sizes tried from ngram_max down to ngram_min."""
    method: str
    k: int = 4
    layers: int = 0
    draft: object = None
    ngram_max: int = 4
    ngram_min: int = 1

    @property
    def name(self) -> str:
        return {"ngram": "ngram", "self": f"self:{self.layers}", "model": "model"}[self.method]


def make_config(model, speculative, num_speculative_tokens: int = 4) -> SpeculativeConfig:
    """"ngram", "self:L", a draft Transformer, or a SpeculativeConfig -> a checked SpeculativeConfig."""
    if isinstance(speculative, SpeculativeConfig):
        config = speculative
    else:
        k = num_speculative_tokens
        if isinstance(speculative, str) and speculative == "ngram":
            config = SpeculativeConfig("ngram", k)
        elif isinstance(speculative, str) and speculative.startswith("self:"):
            layers = speculative[5:]
            if not layers.isdigit():
                raise InputError(f"speculative 'self:L' needs a number of layers L, got {speculative!r}")
            config = SpeculativeConfig("self", k, layers=int(layers))
        elif hasattr(speculative, "forward") and hasattr(speculative, "config"):
            config = SpeculativeConfig("model", k, draft=speculative)
        else:
            raise InputError(f"speculative must be 'ngram', 'self:L' or a draft model, got {speculative!r}")
    if isinstance(config.k, bool) or not isinstance(config.k, int) or not 1 <= config.k <= MAX_SPECULATIVE_TOKENS:
        raise InputError(f"num_speculative_tokens must be an integer in [1, {MAX_SPECULATIVE_TOKENS}], "
                         f"got {config.k!r}")
    n = model.config.n_layers
    if config.method == "self" and not 1 <= config.layers < n:
        raise InputError(f"self:L drafts with the first L layers: L must be in [1, {n - 1}] for this {n}-layer "
                         f"model, got {config.layers}")
    if config.method == "model":
        check_same_vocabulary(model, config.draft)
    return config


def check_cli(name: str | None, draft_model: str | None, n_layers: int | None = None) -> None:
    """`--speculative` and `--draft-model` checked as typed, before any model is loaded (n_layers: the loaded
    model's, to bound self:L); the errors name the flags."""
    if name is not None and name not in ("ngram", "model") and not name.startswith("self:"):
        raise InputError(f"--speculative must be ngram, self:L (L = layers that draft) or model, got {name!r}")
    if name is not None and name.startswith("self:"):
        layers = name[5:]
        top = "" if n_layers is None else f" and < {n_layers} (this model's layers)"
        if not layers.isdigit() or int(layers) < 1 or (n_layers is not None and int(layers) >= n_layers):
            raise InputError(f"--speculative self:L needs a number of layers L >= 1{top}, got {name!r}")
    if name != "model" and draft_model:
        raise InputError("--draft-model is used only with --speculative model")
    if name == "model" and not draft_model:
        raise InputError("--speculative model needs --draft-model PATH (a GGUF with the same vocabulary)")


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

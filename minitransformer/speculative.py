"""Speculative decoding: a cheap drafter guesses k tokens, the model checks all k in ONE forward pass.

    plain:        [decode x] -> t1   [decode t1] -> t2   [decode t2] -> t3 ...        one target pass per token
    speculative:  drafter guesses d1..dk after x;  [target on x, d1..dk] -> rows r0..rk in one pass
                  keep d1 if r0 agrees, d2 if r1 agrees, ...; at the first disagreement take the target's own
                  token instead (or, when all k pass, the bonus token from rk): 1 to k+1 tokens per target pass

Decode is memory-bound (decode.py): a pass over k+1 tokens streams the same weights as a pass over one, so when the
guesses are good the target produces several tokens for about the price of one. Lesson 12 measures whether that
holds on the machine at hand (on 2 CPU cores a 5-token pass is not free, see the lesson).

Verification is done row by row inside generate.py's ordinary loop, so penalties, min_tokens, stop checks, the
detokenizer, logprobs and metrics are the same code as plain decoding; `SpeculativeRunner` stands where
generate.CachedRunner stands and only changes where the next logits come from and how a row's token is chosen:
- greedy: the row's token is the plain greedy choice; the draft is accepted iff it equals it. Output == plain greedy.
- sampling (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding", and Chen et al.
  2023): accept draft d with probability min(1, p(d)/q(d)), p the target's and q the drafter's distribution after
  the same SamplingParams processing; on rejection draw from normalize(max(p - q, 0)). The token then has exactly
  distribution p. A rejected draft has p(d) < q(d), so max(p - q, 0) is 0 at d: "token == draft" means accepted.
Rejected drafts are rolled back with KVCache.truncate: the target cache then equals plain decoding's.

Drafters (`propose(context, k, ...)` -> k draft tokens and the distributions they were drawn from):
- "ngram": prompt lookup (Saxena 2023, github.com/apoorvumang/prompt-lookup-decoding; vLLM's ngram proposer): find
  the context's last n tokens earlier in the context and propose what followed them. No model, one-hot q.
- "self:L": the model's own first L layers + the shared final norm and lm_head (layer-skip self-speculation,
  Zhang et al. 2023 "Draft & Verify"). Its keys/values for layers < L are exactly the target's, so it keeps no cache
  of its own: it writes its draft tokens' K/V into the target cache past the verified length, where the verify pass
  overwrites them.
- a second Transformer with the same vocabulary (`--draft-model PATH`): its own KV cache, rolled back the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import to_host
from .errors import InputError
from .kv_cache import KVCache, estimate_kv_bytes
from .layers import rms_norm, swiglu
from .metrics import now
from .prefill import prefill
from .sampling import _inverse_cdf, apply_penalties, filtered_probs
from .stopping import tokens_to_suppress

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


def from_cli(name: str | None, draft_model: str | None, device: str = "cpu"):
    """`--speculative ngram|self:L|model` and `--draft-model PATH` -> what generate(speculative=...) takes."""
    if name != "model":
        if draft_model:
            raise InputError("--draft-model is used only with --speculative model")
        return name
    if not draft_model:
        raise InputError("--speculative model needs --draft-model PATH (a GGUF with the same vocabulary)")
    from .model import load_model
    return load_model(draft_model, device=device)


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


# ---------------------------------------------------------------------------------------------------- acceptance

def processed_probs(logits, params, prompt_ids, output_ids, eos_id):
    """The distribution plain sampling draws from: min_tokens suppression -> penalties -> temperature, min_p,
    top_k, top_p (sampling.filtered_probs; a one-hot at the argmax for greedy).   logits (1, V) -> (V,) on the host."""
    suppressed = tokens_to_suppress(params, len(output_ids), eos_id)
    if suppressed:
        logits = logits.copy()
        logits[:, list(suppressed)] = -float("inf")
    penalised = apply_penalties(logits, [params], [prompt_ids], [output_ids])
    return to_host(filtered_probs(penalised, [params])[0])


def accept_or_resample(p, q, draft: int, generator) -> int:
    """One speculative-sampling step: the returned token has distribution p whatever q is.

    p (V,) target probabilities, q (V,) the drafter's (None: a one-hot at draft, as n-gram drafts are), draft the
    token drawn from q. Accept it with probability min(1, p[d] / q[d]); otherwise draw from max(p - q, 0),
    renormalised. Two uniforms from the request's generator at most: one for the test, one for the redraw.
    """
    q_d = 1.0 if q is None else float(q[draft])
    if generator.random() * q_d < float(p[draft]):     # u < p/q without dividing by a q of 0
        return draft
    if q is None:
        residual = p.copy()
        residual[draft] = 0.0                           # max(p - onehot, 0): p without d
    else:
        residual = np.maximum(p - q, 0.0)
    if not residual.sum() > 0:                          # p == q up to rounding: nothing left, p itself is exact
        residual = p
    return int(_inverse_cdf(residual[None], [generator.random()])[0])


# ---------------------------------------------------------------------------------------------------- drafters

class NgramDrafter:
    """Prompt lookup: the last n context tokens matched earlier in the context; the k tokens after the most recent
    match are the guess. Costs no model pass, so any accepted token is pure gain."""

    def __init__(self, config: SpeculativeConfig):
        self.ngram_max, self.ngram_min = config.ngram_max, config.ngram_min

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id):
        for n in range(min(self.ngram_max, len(context) - 1), self.ngram_min - 1, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):          # most recent occurrence first
                if context[start:start + n] == tail:
                    return context[start + n:start + n + k], None        # None: one-hot draft distributions
        return [], None


class ModelDrafter:
    """Drafting with a model, k tokens one at a time, with the request's own SamplingParams processing (so q is
    exactly the distribution each draft was drawn from) and its own random stream. A subclass says where the
    model's cache stands (`rewind(context) -> tokens already cached`) and how to run it (`forward(ids, start)`
    -> (1, V) logits after the last of `ids`, placed at positions start, start + 1, ...)."""

    def __init__(self, seed):
        self.generator = np.random.default_rng(None if seed is None else [seed, 1])   # not the target's stream

    def propose(self, context: list[int], k: int, params, prompt_len: int, eos_id):
        prompt, outputs = context[:prompt_len], list(context[prompt_len:])
        start = self.rewind(context)
        logits = self.forward(context[start:], start)                            # (1, V)
        drafts, qs = [], []
        for i in range(k):
            q = processed_probs(logits, params, prompt, outputs, eos_id)          # (V,); one-hot when greedy
            d = int(_inverse_cdf(q[None], [self.generator.random()])[0])         # drawn from q, as sample() draws
            drafts.append(d)
            qs.append(q)
            outputs.append(d)
            if i < k - 1:
                logits = self.forward([d], len(context) + i)
        return drafts, qs


class SelfDrafter(ModelDrafter):
    """The first L layers of the target itself, writing into the target cache's first L layers past its length."""

    def __init__(self, model, layers: int, cache: KVCache, seed):
        super().__init__(seed)
        self.model, self.layers, self.cache = model, layers, cache
        self.view = _FirstLayers(cache, layers)

    def rewind(self, context):
        self.view.length = self.cache.length        # verified tokens: K/V of layers < L are already the target's
        return self.cache.length

    def forward(self, ids, start):
        return forward_first_layers(self.model, ids, start, self.view, self.layers)


class SecondModelDrafter(ModelDrafter):
    """A separate, smaller model of the same vocabulary, with its own KV cache."""

    def __init__(self, draft, max_len: int, seed):
        super().__init__(seed)
        self.draft = draft
        self.cache = KVCache(draft.config, max_len, xp=draft.xp)
        self.ids: list[int] = []                    # the tokens whose K/V self.cache holds

    def rewind(self, context):
        """Keep the longest cached prefix that is still the context (at least one token left to feed)."""
        keep = 0
        limit = min(len(self.ids), len(context) - 1)
        while keep < limit and self.ids[keep] == context[keep]:
            keep += 1
        self.cache.truncate(keep)
        self.ids = self.ids[:keep]
        return keep

    def forward(self, ids, start):
        xp = self.draft.xp
        self.ids.extend(ids)
        positions = xp.arange(start, start + len(ids))[None]
        return self.draft.forward(xp.asarray(ids)[None], positions, kv=self.cache, last_only=True)   # (1, V)


class _FirstLayers:
    """The self-drafter's view of the target cache: layers < L, with its own length (the model's kv protocol)."""

    def __init__(self, cache: KVCache, layers: int):
        self.cache, self.layers, self.length = cache, layers, cache.length

    def update(self, layer, k_new, v_new, positions):
        c, start, end = self.cache, self.length, self.length + k_new.shape[2]
        c.k[layer, :, :, start:end] = k_new
        c.v[layer, :, :, start:end] = v_new
        if layer == self.layers - 1:
            self.length = end
        return c.k[layer, :, :, :end], c.v[layer, :, :, :end], c.key_positions[:, :end]


def forward_first_layers(model, ids: list[int], start: int, kv, layers: int):
    """model.forward cut after `layers` layers, then the shared final norm and lm_head.   T ids -> (1, V) logits
    of the last position. The same stages as Transformer.forward, in the same order, only fewer layers."""
    xp, eps = model.xp, model.config.norm_eps
    positions = xp.arange(start, start + len(ids))[None]                  # (1, T)
    h = model.embedding[xp.asarray(ids)]                                  # (T, D)
    cos, sin = model.rope_cos[positions], model.rope_sin[positions]       # (1, T, d/2)
    for index, layer in enumerate(model.layers[:layers]):
        h = h + model.attention_block(index, layer, rms_norm(h, layer.attn_norm, eps), positions, cos, sin, kv)
        h = h + swiglu(rms_norm(h, layer.ffn_norm, eps), layer.w_gate_up, layer.w_down)
    return rms_norm(h[-1:], model.final_norm, eps) @ model.lm_head         # (1, V)


# ---------------------------------------------------------------------------------------------------- the runner

@dataclass
class SpeculativeStats:
    """Counts for one request (the "speculative" object of --json)."""
    method: str
    k: int
    draft_tokens: int = 0            # guesses checked against the target (drafts past a stop are never checked)
    accepted_tokens: int = 0         # guesses the target kept
    target_passes: int = 0           # forward passes of the target, the prefill included
    output_tokens: int = 0           # tokens the loop took from those passes
    draft_s: float = 0.0             # time spent drafting
    verify_s: float = 0.0            # time spent in verify passes

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_target_pass(self) -> float | None:
        """1.0 for plain decoding; the most speculation can gain if drafting and a longer pass were free."""
        return self.output_tokens / self.target_passes if self.target_passes else None

    def to_dict(self) -> dict:
        return {"method": self.method, "num_speculative_tokens": self.k, "draft_tokens": self.draft_tokens,
                "accepted_tokens": self.accepted_tokens, "acceptance_rate": self.acceptance_rate,
                "target_passes": self.target_passes, "tokens_per_target_pass": self.tokens_per_target_pass,
                "draft_s": self.draft_s, "verify_s": self.verify_s}


class SpeculativeRunner:
    """Stands where generate.CachedRunner stands: first_logits / next_logits / sample_next / release.

    Invariant between calls: the target cache holds K/V for context[:-1] once next_logits has run (the newest token
    is fed by the next verify pass), and `rows` are the logits of the last verify pass, row i following draft i.
    """

    def __init__(self, model, request, config: SpeculativeConfig, cache_class=None):
        self.model, self.config, self.params = model, config, request.params
        self.prompt = list(request.prompt_token_ids)
        self.context = list(self.prompt)
        max_len = len(self.prompt) + self.params.max_tokens
        self.cache = (cache_class or KVCache)(model.config, max_len, xp=model.xp)   # KVCache or Int8KVCache
        seed = self.params.seed
        if config.method == "ngram":
            self.drafter = NgramDrafter(config)
        elif config.method == "self":
            self.drafter = SelfDrafter(model, config.layers, self.cache, seed)
        else:
            if max_len > config.draft.config.context_length:
                raise InputError(f"prompt + max_tokens = {max_len} exceeds the draft model's context length of "
                                 f"{config.draft.config.context_length} tokens")
            self.drafter = SecondModelDrafter(config.draft, max_len, seed)
        self.rows, self.drafts, self.qs, self.row = None, [], None, 0
        self.stats = SpeculativeStats(config.name, config.k)

    def first_logits(self):
        self.stats.target_passes += 1
        return prefill(self.model, self.prompt, self.cache)                    # (1, V)

    def next_logits(self, token: int):
        """The logits after `token`: the next verified row when `token` was the draft there, else a new pass."""
        self.context.append(token)
        if self.row < len(self.drafts) and token == self.drafts[self.row]:
            self.row += 1
            return self.rows[:, self.row]                                      # (1, V), already computed
        self.cache.truncate(len(self.context) - 1)        # drop the rejected drafts' K/V (a no-op after a bonus)
        return self._draft_and_verify(token)

    def _draft_and_verify(self, token: int):
        emitted = len(self.context) - len(self.prompt)
        k = min(self.config.k, self.params.max_tokens - emitted - 1)         # never draft past max_tokens
        start = now()
        drafts, qs = self.drafter.propose(self.context, k, self.params, len(self.prompt), self.model.tokenizer.eos_id) \
            if k > 0 else ([], None)
        self.stats.draft_s += now() - start
        xp, base = self.model.xp, len(self.context) - 1
        ids = xp.asarray([token] + drafts)[None]                               # (1, 1 + k)
        positions = xp.arange(base, base + 1 + len(drafts))[None]              # (1, 1 + k)
        start = now()
        self.rows = self.model.forward(ids, positions, kv=self.cache)          # (1, 1 + k, V): one target pass
        self.stats.verify_s += now() - start
        self.stats.target_passes += 1
        self.drafts, self.qs, self.row = drafts, qs, 0
        return self.rows[:, 0]                                                 # (1, V)

    def sample_next(self, logits, request, generator, output_ids, eos_id, sample_plain) -> int:
        """The token for this row: plain sampling where there is no draft to check (and for greedy, whose plain
        choice decides acceptance by itself); speculative sampling against the draft otherwise."""
        self.stats.output_tokens += 1
        if self.row >= len(self.drafts):                                       # a bonus row, or no drafts
            return sample_plain(logits, request, generator, output_ids, eos_id)
        draft = self.drafts[self.row]
        if request.params.greedy:
            token = sample_plain(logits, request, generator, output_ids, eos_id)
        else:
            p = processed_probs(logits, request.params, request.prompt_token_ids, output_ids, eos_id)   # (V,)
            token = accept_or_resample(p, None if self.qs is None else self.qs[self.row], draft, generator)
        self.stats.draft_tokens += 1
        self.stats.accepted_tokens += token == draft
        return token

    @property
    def kv_tokens(self) -> int:
        """Tokens verified and emitted into the context (drafts accepted past a stop are not counted): the same
        number plain decoding's cache holds at the same point."""
        return len(self.context)

    @property
    def kv_bytes(self) -> int:
        return estimate_kv_bytes(self.model.config, self.kv_tokens, dtype=self.cache.dtype)

    def release(self) -> None:
        self.cache.release()
        if isinstance(self.drafter, SecondModelDrafter):
            self.drafter.cache.release()

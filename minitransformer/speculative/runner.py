"""SpeculativeRunner, which stands where core's CachedRunner stands: draft, verify all k in one target pass, roll
back the rejected drafts' K/V; speculative_runner, the factory core's generate(runner=) takes; and SpeculativeStats,
its counts for --json (lesson 12).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.backend import to_host
from ..core.kv_cache import KVCache, estimate_kv_bytes
from ..core.metrics import now
from ..core.prefill import prefill
from ..core.sampling import distribution
from .acceptance import accept_or_resample
from .config import SpeculativeConfig, make_config
from .drafters import make_drafter


@dataclass
class VerifyPass:
    """One target pass as the loop used it: the drafts it checked, how many it kept, and the token the target
    itself supplied (the correction at the first rejected draft, or the bonus after the last kept one; None when a
    stop came first). The prefill is pass 0, with no drafts. figures/draft_and_verify.png draws these."""
    drafted: list[int]
    accepted: int = 0
    target_token: int | None = None


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
    passes: list[VerifyPass] = field(default_factory=list)     # per target pass, in order

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
                "draft_s": self.draft_s, "verify_s": self.verify_s,
                "passes": [[p.drafted, p.accepted, p.target_token] for p in self.passes]}


def speculative_runner(speculative, num_speculative_tokens: int = 4):
    """The runner factory for generate / stream (core.generate.RunnerFactory): speculative is "ngram", "self:L" (the
    first L layers draft), a draft Transformer of the same vocabulary, or a SpeculativeConfig; num_speculative_tokens
    the k tokens drafted per target pass. Checked against the model when the request is made (make_config), before
    any model work. Greedy output is the same as without it; sampled output has the same distribution."""
    def factory(model, request, storage: str = "f32") -> SpeculativeRunner:
        return SpeculativeRunner(model, request, make_config(model, speculative, num_speculative_tokens), storage)
    return factory


class SpeculativeRunner:
    """Stands where core's CachedRunner stands (core.generate.Runner): first_logits / next_logits / sample_next /
    release, and report() gives the stats for Result.speculative.

    Invariant between calls: the target cache holds K/V for context[:-1] once next_logits has run (the newest token
    is fed by the next verify pass), and `rows` are the logits of the last verify pass, row i following draft i.
    """

    def __init__(self, model, request, config: SpeculativeConfig, storage: str = "f32"):
        self.model, self.config, self.params = model, config, request.params
        self.prompt = list(request.prompt_token_ids)
        self.context = list(self.prompt)
        max_len = len(self.prompt) + self.params.max_tokens
        self.cache = KVCache(model.config, max_len, xp=model.xp, storage=storage)
        self.drafter = make_drafter(model, config, self.cache, max_len, self.params.seed)
        self.rows: Any = None                   # (1, 1 + k, V) logits of the last verify pass, NumPy or CuPy
        self.drafts: list[int] = []
        self.qs: list | None = None             # the drafts' distributions (None: one-hot drafts)
        self.row = 0
        self.constraint = None                  # the request's structured-output matcher (sample_next sees it)
        self.stats = SpeculativeStats(config.name, config.k)

    def first_logits(self):
        self.stats.target_passes += 1
        self.stats.passes.append(VerifyPass([]))
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
        # the loop appended `token` to the request before asking for these logits: its matcher stands at the end
        # of self.context, where the drafts start
        drafts, qs = self.drafter.propose(self.context, k, self.params, len(self.prompt), self.model.tokenizer.eos_id,
                                          self.constraint) if k > 0 else ([], None)
        self.stats.draft_s += now() - start
        xp, base = self.model.xp, len(self.context) - 1
        ids = xp.asarray([token] + drafts)[None]                               # (1, 1 + k)
        positions = xp.arange(base, base + 1 + len(drafts))[None]              # (1, 1 + k)
        start = now()
        self.rows = self.model.forward(ids, positions, self.cache)          # (1, 1 + k, V): one target pass
        self.stats.verify_s += now() - start
        self.stats.target_passes += 1
        self.stats.passes.append(VerifyPass(list(drafts)))
        self.drafts, self.qs, self.row = drafts, qs, 0
        return self.rows[:, 0]                                                 # (1, V)

    def sample_next(self, logits, state) -> int:
        """The token for this row: plain sampling where there is no draft to check (and for greedy, whose plain
        choice decides acceptance by itself); speculative sampling against the draft otherwise. With structured
        output both go through the request's mask at this row, so a draft the constraint refuses is never kept."""
        self.constraint = state.constraint
        self.stats.output_tokens += 1
        record = self.stats.passes[-1]
        if self.row >= len(self.drafts):                                       # a bonus row, or no drafts
            record.target_token = state.sample(logits)
            return record.target_token
        draft = self.drafts[self.row]
        if state.params.greedy:
            token = state.sample(logits)
        else:
            p = to_host(distribution(logits, [state])[0])                     # (V,) what plain sampling draws from
            token = accept_or_resample(p, None if self.qs is None else self.qs[self.row], draft, state.generator)
        self.stats.draft_tokens += 1
        self.stats.accepted_tokens += token == draft
        if token == draft:
            record.accepted += 1
        else:
            record.target_token = token                                        # the first rejection ends the pass
        return token

    @property
    def kv_tokens(self) -> int:
        """Tokens verified and emitted into the context (drafts accepted past a stop are not counted): the same
        number plain decoding's cache holds at the same point."""
        return len(self.context)

    @property
    def kv_bytes(self) -> int:
        return estimate_kv_bytes(self.model.config, self.kv_tokens, storage=self.cache.storage)

    def report(self) -> dict:
        """What Result.speculative carries: how the drafts fared."""
        return self.stats.to_dict()

    def release(self) -> None:
        self.cache.release()
        self.drafter.release()

"""One request's matcher (core's TokenMask): which tokens may come next, advanced by each token the loop takes, and
what llguidance is told about our tokenizer.

A constraint can fail while a request runs: a limit of the parser reached by the text so far, a mask that takes
longer than its budget. Then it records why (`error`), allows only the end-of-sequence token, and the stop rules end
the request with finish_reason "abort", stop_reason "constraint" (core/stopping.py): the request ends, its blocks are
freed, and the batch it ran in goes on. Nothing here raises into the engine's step for the client's constraint.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence

import llguidance
import numpy as np

from ..core.errors import InputError
from ..core.metrics import cpu_now, now
from .limits import one_line

MAX_FORCED_TOKENIZE = 1024      # bytes of dictated text handed to our tokenizer per mask (its longest token: 81)
BUDGET_GRACE = 4                # masks' worth of budget a constraint may overspend before its average counts

_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # tokenizer -> llguidance.LLTokenizer


class _TokenizerView:
    """Our tokenizer as llguidance's TokenizerWrapper reads one: each token's bytes (control tokens marked with a
    leading 0xFF byte, llguidance's convention for "special: never produced by text"), EOS and BOS ids, and a
    function from text bytes to ids (llguidance tokenizes dictated text with it, canonically).

    llguidance hands that function the whole remaining dictated text before every mask and uses only its first
    tokens; a constraint that dictates 65 KB would have our tokenizer encode 65 KB per token. So only the first
    MAX_FORCED_TOKENIZE bytes are encoded, cut at a character boundary."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(tokenizer.control_ids)
        self.tokens = [b"\xff" + tokenizer.token_bytes(i) if i in tokenizer.control_ids else tokenizer.token_bytes(i)
                       for i in range(tokenizer.vocab_size)]

    def __call__(self, text: bytes) -> list[int]:
        return self.tokenizer.encode(text[:MAX_FORCED_TOKENIZE].decode("utf-8", errors="ignore"))


def vocabulary(tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer`, built once per tokenizer (it indexes every token's bytes: ~0.1 s for
    49,152 tokens) and shared by all its requests."""
    vocab = _vocabularies.get(tokenizer)
    if vocab is None:
        if tokenizer.eos_id is None:
            raise InputError("structured output needs the tokenizer's end-of-sequence token, and this model's "
                             "tokenizer names none")
        vocab = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_TokenizerView(tokenizer)))
        _vocabularies[tokenizer] = vocab
    return vocab


class Constraint:
    """One request's position in its constraint: which tokens may come next, advanced by each token taken.

    allowed(V) -> (V,) bool mask of the ids the sampler may draw (computed once per position);
    accept(token) after the loop takes a token; complete: nothing but EOS could follow (the request stops);
    error: why the constraint cannot go on, or None (the request then ends: the module docstring).
    mask_s and allowed_counts record what each mask cost and how many tokens it let through (lesson 05).
    The matcher only ever sees tokens the loop took. Speculative decoding drafts ahead of it (lesson 12): a model
    drafter draws each guess under the mask of a fork() advanced through the guesses before it, the n-gram drafter
    cuts its guess at valid_prefix; what the drafts' checks cost is counted apart (draft_masks, draft_mask_s), as
    it is not the request's per-token mask.
    """
    error: str | None
    mask_s: float

    def __init__(self, params, tokenizer):
        self.params = params                      # the StructuredOutputsParams it was made from
        self.kind, self.limits = params.kind, params.limits
        self.matcher = params.prepare(tokenizer).deep_copy()      # its own copy of the model's cached template
        self.vocab_size = tokenizer.vocab_size
        self.eos_id = tokenizer.eos_id
        self._bitmask = np.full((1, (self.vocab_size + 31) // 32), -1, dtype=np.int32)   # (1, ceil(V/32)) 1 bit/id
        self._mask: np.ndarray | None = None      # the mask of the current position, until a token is accepted
        self.error = None
        self.mask_s = 0.0                         # time spent computing masks, seconds
        self.budgeted_cpu_s = 0.0                 # the masks' CPU time (what the budget measures), seconds
        self.allowed_counts: list[int] = []       # tokens allowed at each position a mask was computed for
        self.draft_masks = 0                      # masks and checks made for speculative drafts (fork, valid_prefix)
        self.draft_mask_s = 0.0                   # ... and their time, seconds
        self._owner: Constraint | None = None     # a fork: the request's constraint it drafts ahead of
        self._at_owner = False                    # a fork not yet advanced stands where its owner stands

    def allowed(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) bool on the host: True where the token keeps the output inside the constraint. Ids past the
        tokenizer's vocabulary (a padded lm_head) are never allowed. After a failure: EOS alone."""
        if self._owner is not None and self._at_owner:
            return self._owner.allowed(vocab_size)   # the request's own next mask: its verify row needs it too
        if self._mask is None or self._mask.shape[0] != vocab_size:
            start, cpu_start = now(), cpu_now()
            mask = np.zeros(vocab_size, dtype=bool)                                          # (V,)
            if self.error is None:
                try:
                    self.matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
                except Exception as exc:                # the matcher itself failed: this request's end, not the batch's
                    self.fail(f"the {self.kind} constraint's matcher failed at output token "
                              f"{len(self.allowed_counts) + 1}: {type(exc).__name__}: {exc}")
                bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")[:self.vocab_size]   # (V_tok,)
                mask[:min(vocab_size, self.vocab_size)] = bits[:vocab_size].astype(bool)
            elapsed, cpu = now() - start, cpu_now() - cpu_start
            self._check(cpu)
            if self.error is not None:
                mask[:] = False
                mask[self.eos_id] = True
            if self._owner is None:
                self.mask_s += elapsed
                self.allowed_counts.append(int(mask.sum()))
            else:
                self._owner.draft_masks += 1
                self._owner.draft_mask_s += elapsed
            self._mask = mask
        return self._mask

    def _check(self, cpu_s: float) -> None:
        """After a mask: a limit its parser reached, or its cost over the budget, ends the constraint.

        The budget is on average, in the engine thread's CPU time (not wall time: a machine busy with other work
        must not end a request): the masks may spend mask_budget_s each, plus BUDGET_GRACE masks' worth for the odd
        slow one (a lexer state built the first time it is reached; the costly first mask was computed once, off
        the engine thread, when the constraint was prepared: params.prepare). So a constraint that goes on adds at
        most mask_budget_s to each step of its batch, and one that costs more is ended within a few tokens."""
        position = len(self.allowed_counts) + 1                 # the output token this mask is for
        if self.error is not None:
            return
        if self.matcher.is_error():
            self.fail(f"the {self.kind} constraint reached a limit of its parser at output token {position}: "
                      f"{one_line(self.matcher.get_error())}")
            return
        if self._owner is not None:
            return                                              # a draft's checks are not the request's masks
        self.budgeted_cpu_s += cpu_s
        if self.budgeted_cpu_s > self.limits.mask_budget_s * (position + BUDGET_GRACE):
            self.fail(f"the {self.kind} constraint's masks took {self.budgeted_cpu_s / position * 1e3:.3g} ms per "
                      f"token over {position} tokens; at most {self.limits.mask_budget_s * 1e3:.3g} ms per token are "
                      "allowed (serve --structured-mask-budget raises it)")

    def fail(self, reason: str) -> None:
        """The constraint cannot go on: keep the first reason; from now on only EOS is allowed."""
        if self.error is None:
            self.error = reason

    def accept(self, token: int) -> None:
        """Advance past the token the loop took. A limit the parser reaches here ends the constraint (error); a token
        the mask forbade is a bug in the loop, and raises."""
        allowed = self._mask is not None and bool(self._mask[int(token)])
        self._mask = None
        self._at_owner = False
        if self.error is not None:
            return
        try:
            consumed = self.matcher.consume_token(int(token))
        except Exception as exc:
            self.fail(f"the {self.kind} constraint's matcher failed at output token {len(self.allowed_counts)}: "
                      f"{type(exc).__name__}: {exc}")
            return
        if not consumed:
            if self.matcher.is_error() and allowed:
                self.fail(f"the {self.kind} constraint reached a limit of its parser at output token "
                          f"{len(self.allowed_counts)}: {one_line(self.matcher.get_error())}")
                return
            raise RuntimeError(f"token {token} breaks the {self.kind} constraint: {self.matcher.get_error()}")

    def fork(self) -> Constraint:
        """A copy of this matcher for drafting ahead: a model drafter takes each guess under fork.allowed(V) and
        advances the fork by it (fork.accept), so every guess keeps the output inside the constraint; the request's
        own matcher never sees a guess. Dropping the fork is the roll-back of the rejected guesses.

        Why a copy and not LLMatcher.rollback(n) on the request's matcher: both are cheap next to computing one
        mask (llguidance's deep_copy costs about as much as consuming and rolling back a few tokens), and a copy
        cannot leave the request's matcher advanced by a guess -- not when a draft pass raises, nor when the loop
        ends mid-draft -- nor make the request's cached mask stale. The fork's masks count as draft_masks of this
        constraint, not as its per-token mask cost; its first mask is this constraint's next one (the verify row
        needs that mask anyway), so it is computed once."""
        draft = copy.copy(self)
        draft.matcher = self.matcher.deep_copy()
        draft._bitmask = self._bitmask.copy()
        draft._mask, draft._owner, draft._at_owner = None, self, True
        draft.allowed_counts = []
        return draft

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the current position, the constraint accepts in order (the matcher does not
        move): a one-hot drafter (n-gram lookup) cuts its guess there, since a guess past it would only be
        rejected by the verify pass. Counted as one draft check."""
        if not tokens or self.error is not None:
            return 0
        start = now()
        count = self.matcher.validate_tokens([int(t) for t in tokens])
        self.draft_masks += 1
        self.draft_mask_s += now() - start
        return count

    @property
    def masks(self) -> int:
        """The request's masks so far (its drafts' not counted)."""
        return len(self.allowed_counts)

    @property
    def complete(self) -> bool:
        """The constraint is satisfied and nothing but EOS could follow (or EOS was taken)."""
        return self.error is None and self.matcher.is_stopped()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete match (EOS is allowed), though more may follow (a regex like `a+`)."""
        return self.error is None and self.matcher.is_accepting()

    def summary(self) -> dict:
        """Result.structured: the constraint's kind, whether the output completed it, why it failed if it did, and
        what the masks cost (draft_masks / draft_mask_s: the checks of speculative drafts, zero without them)."""
        masks = len(self.allowed_counts)
        error = self.error or self.matcher.get_error() or None     # is_stopped() is true in an error state too
        return {"type": self.kind, "complete": not error and (self.complete or self.accepting),
                "error": error, "masks": masks,
                "mask_s": self.mask_s, "mask_s_per_token": self.mask_s / masks if masks else None,
                "allowed_tokens": list(self.allowed_counts),
                "draft_masks": self.draft_masks, "draft_mask_s": self.draft_mask_s}

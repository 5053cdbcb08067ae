"""Stage: logits -> next token. SamplingParams, penalties, temperature, min_p, top_k, top_p and the draw.

The order is vLLM v1's sampler (vllm/v1/sample/sampler.py), so every knob means what it means there:

    structured-output mask -> suppression (min_tokens) -> penalties -> greedy argmax kept aside -> temperature
    -> min_p -> top_k -> top_p -> draw -> logprobs (of the raw logits)

This file is the one place that order is written. Every loop samples requests through it: `next_tokens(logits,
states)` runs the whole stage for a batch of requests (the serving Engine), `sample_tokens` the same without the
logprobs (generate.py's loop, one row, through request.RequestState.sample), `distribution` stops before the draw
(the speculative runner's target and draft distributions), and `request_logprobs` reports what each request asked
for. A request is anything with the six attributes of `SamplingState` (request.RequestState is one; `SamplingRow`
spells one out for callers without a request); `sample`, `filtered_probs` and `apply_penalties` are the row-wise
stages beneath, which the lessons call directly.

Everything is batched over rows, each row with its own SamplingParams and its own random generator: generate.py
calls it with one row, the serving engine with many. A seeded request must give the same tokens whatever it is
batched with, so each row's math only ever looks at that row, and each sampled row takes exactly one number from its
own generator per step (greedy rows take none). The arrays stay on the model's device (`xp` is NumPy or CuPy);
only small host values cross: the per-row settings going in, one uniform per row, and the (B,) token ids coming out.

Curriculum F5 (sample the first token) and H2 (the decode loop in miniature) show this stage; `filtered_probs`
exists so a lesson can print the distribution each filter leaves.
Shapes: B rows (requests), V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from .backend import INDEX_DTYPE, array_module, to_host
from .layers import softmax
from .sampling_params import SamplingParams, TokenMask

# top_p without top_k first sorts only this many of the largest logits, and the whole row only if they fall short.
TOP_P_PREFIX = 1024
# The largest logit magnitude penalties and temperature may produce (bounded_scale): far above any logit a model
# produces, far enough below float32's 3.4e38 that the difference of two such logits is still finite.
LOGIT_LIMIT = 1e37


def make_generator(seed: int | None) -> np.random.Generator:
    """One request's own random stream: seeded -> reproducible, and no other request ever draws from it."""
    return np.random.default_rng(seed)


# --- the stage, for requests ------------------------------------------------------------------------------------

class SamplingState(Protocol):
    """What the sampler reads of one request. request.RequestState is one (so generate()'s loop, the Engine's
    Sequence and the speculative runner all sample the same request the same way); SamplingRow is another."""

    @property
    def params(self) -> SamplingParams: ...

    @property
    def prompt_token_ids(self) -> Sequence[int]: ...

    @property
    def output_ids(self) -> Sequence[int]: ...               # tokens generated so far (the penalties count them)

    @property
    def suppressed(self) -> Sequence[int]: ...               # ids that must not come next (stopping.tokens_to_suppress)

    @property
    def generator(self) -> np.random.Generator | None: ...   # the request's own random stream (None: greedy only)

    @property
    def constraint(self) -> TokenMask | None: ...            # structured output's matcher (None: unconstrained)


@dataclass(frozen=True)
class SamplingRow:
    """A SamplingState spelled out, for a caller without a request: a drafter sampling ahead of the verified
    output, a lesson."""
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_ids: Sequence[int]
    suppressed: Sequence[int] = ()
    generator: np.random.Generator | None = None
    constraint: TokenMask | None = None


def next_tokens(logits, states: Sequence[SamplingState]) -> tuple[np.ndarray, list[dict | None]]:
    """The whole stage for a batch of requests.   raw logits (B, V) -> (B,) int64 token ids on the host, and row b's
    logprobs entry (compute_logprobs' dict; None when its request asked for none)."""
    tokens = sample_tokens(logits, states)                                       # (B,)
    return tokens, request_logprobs(logits, tokens, states)


def sample_tokens(logits, states: Sequence[SamplingState]) -> np.ndarray:
    """mask -> suppression -> penalties -> filters -> draw.   raw logits (B, V) -> (B,) int64 token ids on the host."""
    masked = mask_tokens(logits, [s.suppressed for s in states], allowed_tokens(states, logits.shape[-1]))  # (B, V)
    return sample(masked, [s.params for s in states], [s.generator for s in states],
                  [s.prompt_token_ids for s in states], [s.output_ids for s in states])


def distribution(logits, states: Sequence[SamplingState]):
    """The distribution sample_tokens draws from: suppression -> penalties -> temperature, min_p, top_k, top_p
    (a one-hot at the argmax for a greedy row).   raw logits (B, V) -> probabilities (B, V) on the device."""
    params = [s.params for s in states]
    masked = mask_tokens(logits, [s.suppressed for s in states], allowed_tokens(states, logits.shape[-1]))  # (B, V)
    processed = process_logits(masked, params, [s.prompt_token_ids for s in states], [s.output_ids for s in states])
    return filtered_probs(processed, params)


def request_logprobs(logits, tokens, states: Sequence[SamplingState]) -> list[dict | None]:
    """Row b's logprobs of tokens[b] with the params.logprobs alternatives its request asked for (None: it asked for
    none), from the RAW logits as vLLM reports them.   logits (B, V), tokens (B,). One compute_logprobs call over
    the rows that asked, each row's alternatives then cut to its own count."""
    asked = {b: count for b, s in enumerate(states) if (count := s.params.logprobs) is not None}   # row -> count
    wanted = list(asked)
    entries: list[dict | None] = [None] * len(states)
    if wanted:
        tokens = np.asarray(tokens, dtype=INDEX_DTYPE)                           # (B,) on the host
        for b, entry in zip(wanted, compute_logprobs(logits[wanted], tokens[wanted], max(asked.values()))):
            entry["top"] = entry["top"][:asked[b]]
            entries[b] = entry
    return entries


def allowed_tokens(states: Sequence[SamplingState], V: int) -> list[np.ndarray | None]:
    """Row b's structured-output mask, (V,) bool on the host, or None when its request is unconstrained."""
    return [None if s.constraint is None else s.constraint.allowed(V) for s in states]


def mask_tokens(logits, suppressed_rows, allowed_rows: Sequence[np.ndarray | None] = ()):
    """logits (R, V) with what row r may not draw set to -inf: the ids outside allowed_rows[r] (a structured-output
    mask, (V,) bool; None: no constraint), then the ids in suppressed_rows[r]. A copy when any row is masked (the
    raw logits stay as they are for logprobs), the same array when none is.

    The constraint wins over suppression: when min_tokens would remove the only tokens the constraint allows (EOS
    at a complete match), those stay, since no token could follow otherwise.
    """
    if not any(suppressed_rows) and all(allowed is None for allowed in allowed_rows):
        return logits
    xp = array_module(logits)
    logits = logits.copy()
    masks = {row: allowed for row, allowed in enumerate(allowed_rows) if allowed is not None}   # row -> (V,) bool
    for row, allowed in masks.items():
        logits[row] = xp.where(xp.asarray(allowed), logits[row], -xp.inf)                     # (V,)
    for row, ids in enumerate(suppressed_rows):
        if ids:
            ids = list(ids)
            if row in masks and not np.delete(masks[row], ids).any():
                continue
            logits[row, ids] = -float("inf")
    return logits


# --- the stages, row by row -------------------------------------------------------------------------------------

def sample(logits, params: Sequence[SamplingParams], generators: Sequence[np.random.Generator | None],
           prompt_ids: Sequence[Sequence[int]], output_ids: Sequence[Sequence[int]]) -> np.ndarray:
    """Pick the next token of every row.   logits (B, V) float32 on the device -> (B,) int64 token ids on the host.

    Row b uses params[b] and generators[b] (None is allowed for a greedy row: it draws nothing), and its penalties
    count prompt_ids[b] and output_ids[b] (the tokens generated so far).
    """
    xp = array_module(logits)
    if logits.ndim != 2:
        raise ValueError(f"sample() takes logits of shape (B, V), got {logits.shape}")
    B, V = logits.shape
    if not len(params) == len(generators) == len(prompt_ids) == len(output_ids) == B:
        raise ValueError(f"sample(): {B} rows of logits but {len(params)} params, {len(generators)} generators, "
                         f"{len(prompt_ids)} prompts and {len(output_ids)} outputs")
    logits = process_logits(logits, params, prompt_ids, output_ids)            # (B, V)

    tokens = np.empty(B, dtype=INDEX_DTYPE)                                      # (B,) on the host
    greedy = [b for b in range(B) if params[b].greedy]
    drawn = [b for b in range(B) if not params[b].greedy]
    if greedy:      # argmax returns the first maximum: ties go to the lowest token id
        tokens[greedy] = to_host(xp.argmax(logits[greedy], axis=-1))
    if drawn:       # only the sampled rows go through the filters: a greedy neighbour changes nothing
        drawing: list[np.random.Generator] = []
        for b in drawn:
            generator = generators[b]
            if generator is None:
                raise ValueError(f"sample(): row {b} samples (temperature {params[b].temperature}) "
                                 "but has no generator")
            drawing.append(generator)
        probs = filtered_probs(logits[drawn], [params[b] for b in drawn])        # (S, V)
        uniforms = [generator.random() for generator in drawing]                 # exactly one draw per sampled row
        tokens[drawn] = _inverse_cdf(probs, uniforms)
    return tokens


def process_logits(logits, params: Sequence[SamplingParams], prompt_ids: Sequence[Sequence[int]],
                   output_ids: Sequence[Sequence[int]]):
    """Every stage that changes the logits before the greedy choice and the filters (today the penalties; a new
    logits-level option adds its stage here, and both sample() and distribution() run it).   (B, V) -> (B, V)."""
    return apply_penalties(logits, params, prompt_ids, output_ids)


def apply_penalties(logits, params: Sequence[SamplingParams], prompt_ids: Sequence[Sequence[int]],
                    output_ids: Sequence[Sequence[int]]):
    """Repetition, frequency and presence penalties, as vLLM applies them.   (B, V) -> (B, V), same dtype.

    repetition (HF / CTRL paper): every distinct token of prompt + output has its logit pushed toward "less likely"
    (divided by r when positive, multiplied by r when not). frequency and presence (OpenAI's definitions) look at the
    output only: subtract frequency_penalty * count and presence_penalty once per distinct token.
    The token sets are built on the host (they are short lists) and scattered into (B, V) arrays on the device.
    Rows whose penalties are neutral are left bit-for-bit unchanged; with no penalty at all the input itself is
    returned (no copy on the decode path), otherwise a new array (the caller's logits are never written).
    """
    xp = array_module(logits)
    B, V = logits.shape
    repeat_rows = [b for b in range(B) if params[b].repetition_penalty != 1.0]
    if repeat_rows:
        seen = xp.zeros((B, V), dtype=bool)                                      # (B, V) in prompt or output
        rows, ids = _scatter_indices(repeat_rows, [list(prompt_ids[b]) + list(output_ids[b]) for b in repeat_rows], V)
        seen[xp.asarray(rows), xp.asarray(ids)] = True
        r = xp.asarray([p.repetition_penalty for p in params], dtype=logits.dtype)[:, None]       # (B, 1)
        penalised = xp.where(logits > 0, bounded_scale(logits, r, divide=True), bounded_scale(logits, r))
        logits = xp.where(seen, penalised, logits)
    count_rows = [b for b in range(B) if params[b].frequency_penalty != 0.0 or params[b].presence_penalty != 0.0]
    if count_rows:
        counts = xp.zeros((B, V), dtype=logits.dtype)                            # (B, V) occurrences in output
        rows, ids, n = _scatter_indices(count_rows, [output_ids[b] for b in count_rows], V, with_counts=True)
        counts[xp.asarray(rows), xp.asarray(ids)] = xp.asarray(n, dtype=logits.dtype)
        frequency = xp.asarray([p.frequency_penalty for p in params], dtype=logits.dtype)[:, None]  # (B, 1)
        presence = xp.asarray([p.presence_penalty for p in params], dtype=logits.dtype)[:, None]    # (B, 1)
        logits = logits - frequency * counts - presence * (counts > 0)
    return logits


def bounded_scale(logits, factor, divide: bool = False):
    """logits * factor, or logits / factor, with no result beyond +-LOGIT_LIMIT.   (B, V), factor (B, 1) > 0.

    Penalties and temperature scale logits by factors the user picks. Unbounded, a large logit overflows float32 to
    inf, and two inf logits make the softmax's inf - inf a NaN (a RuntimeWarning, then garbage tokens). So the
    logits are clipped first to the magnitude that the factor takes exactly to LOGIT_LIMIT: results within the
    limit are bit-for-bit the plain product or quotient, nothing overflows on the way, and -inf (a token removed
    before sampling) stays -inf.
    """
    xp = array_module(logits)
    bound = LOGIT_LIMIT * xp.minimum(factor, 1) if divide else LOGIT_LIMIT / xp.maximum(factor, 1)   # (B, 1)
    clipped = xp.where(logits == -xp.inf, logits, xp.minimum(xp.maximum(logits, -bound), bound))       # (B, V)
    return clipped / factor if divide else clipped * factor


def _scatter_indices(rows: list[int], token_lists, V: int, with_counts: bool = False):
    """(row, distinct token id[, count]) for each row's token list, as flat host arrays ready for fancy indexing."""
    all_rows, all_ids, all_counts = [], [], []
    for b, tokens in zip(rows, token_lists):
        ids, counts = np.unique(np.asarray(tokens, dtype=INDEX_DTYPE), return_counts=True)
        if ids.size and (ids[0] < 0 or ids[-1] >= V):
            raise ValueError(f"row {b}: token ids must be in [0, {V}), got {ids[0] if ids[0] < 0 else ids[-1]}")
        all_rows.append(np.full(ids.size, b, dtype=INDEX_DTYPE))
        all_ids.append(ids)
        all_counts.append(counts)
    flat = (np.concatenate(all_rows), np.concatenate(all_ids))
    return flat + (np.concatenate(all_counts),) if with_counts else flat


def filtered_probs(logits, params: Sequence[SamplingParams]):
    """The distribution each row is drawn from.   penalised logits (B, V) -> probabilities (B, V), rows sum to 1.

    temperature -> min_p -> top_k -> top_p, then a softmax over the tokens that survived (renormalised).
    A greedy row gets a one-hot at its argmax: the point mass sample() takes.
    """
    xp = array_module(logits)
    B, V = logits.shape
    temperatures = [1.0 if p.greedy else p.temperature for p in params]
    temperature = xp.asarray(temperatures, dtype=logits.dtype)[:, None]
    # A float32 (B, 1) column: the same float32 division as by a Python float (both round the temperature to
    # float32 first), never a float64 one (backend.py: "float32 everywhere"). A temperature below 1 magnifies the
    # logits, so then the division is bounded (a float32 logit over 1e-5 can overflow).
    scaled = logits / temperature if min(temperatures) >= 1 else bounded_scale(logits, temperature, divide=True)
    keep = None                                                                  # (B, V) bool once a filter runs

    if any(p.min_p > 0 for p in params):
        # min_p: keep tokens at least min_p times as likely as the most likely one, after temperature.
        probs = softmax(scaled)                                                  # (B, V)
        min_p = xp.asarray([p.min_p for p in params], dtype=logits.dtype)[:, None]
        keep = probs >= min_p * probs.max(axis=-1, keepdims=True)

    if any(p.top_k > 0 or p.top_p < 1 for p in params):
        masked = scaled if keep is None else xp.where(keep, scaled, -xp.inf)     # (B, V) min_p's removals -inf
        top = _top_k_top_p_mask(masked, params)
        keep = top if keep is None else keep & top

    probs = softmax(scaled if keep is None else xp.where(keep, scaled, -xp.inf))  # (B, V) renormalised
    greedy = [b for b in range(B) if params[b].greedy]
    if greedy:
        one_hot = xp.zeros((len(greedy), V), dtype=probs.dtype)
        one_hot[xp.arange(len(greedy)), xp.argmax(logits[greedy], axis=-1)] = 1.0
        probs[greedy] = one_hot
    return probs


def _top_k_top_p_mask(masked, params: Sequence[SamplingParams], width: int | None = None):
    """top_k then top_p on logits where removed tokens are -inf.   (B, V) -> keep (B, V) bool.

    Both filters come out as a threshold on the logit ("keep logit >= t"), so one descending sort serves both:
    - top_k: t = the k-th largest logit, so every token tied with the k-th is kept (vLLM / HF do the same).
    - top_p: over what top_k kept, renormalised, walk the tokens from most to least probable and keep each one whose
      preceding mass is still < top_p: the smallest set whose mass reaches top_p. The first token always stays
      (preceding mass 0). Ties at the boundary: the boundary token's logit becomes the threshold, so every token
      tied with it is kept too (the set can exceed the smallest one by those ties). vLLM and HF leave this to an
      unstable sort; keeping the whole tie makes the result independent of token numbering, like top_k.
    Only the largest logits can pass, so the sort covers a prefix, the W largest logits found by an O(V) partition,
    instead of all V (a full sort of the vocabulary per row is the sampler's largest cost): W = the largest top_k, or
    at least TOP_P_PREFIX when a row has top_p without top_k; if those W tokens do not reach such a row's top_p, sort
    all V.
    Every number a row's decision uses is the same whatever W is, so the result does not depend on the neighbours.
    """
    xp = array_module(masked)
    B, V = masked.shape
    top_k_on = xp.asarray([p.top_k > 0 for p in params])[:, None]                             # (B, 1)
    top_p_on = xp.asarray([p.top_p < 1 for p in params])[:, None]                             # (B, 1)
    top_p = xp.asarray([p.top_p for p in params], dtype=masked.dtype)[:, None]                # (B, 1)
    ks = [min(p.top_k, V) if p.top_k > 0 else V for p in params]
    top_p_only = [p.top_p < 1 and p.top_k <= 0 for p in params]
    if width is None:
        width = min(V, max([k for k, p in zip(ks, params) if p.top_k > 0] + [TOP_P_PREFIX * any(top_p_only)]))
    top = masked if width == V else -xp.partition(-masked, width - 1, axis=-1)[:, :width]    # (B, W) unordered
    descending = xp.sort(top, axis=-1)[:, ::-1]                                  # (B, W) the W largest, largest first

    k = xp.asarray([min(k, width) for k in ks], dtype=INDEX_DTYPE)[:, None]                  # (B, 1)
    kth = xp.where(top_k_on, xp.take_along_axis(descending, k - 1, axis=-1), -xp.inf)       # (B, 1) top_k threshold
    descending = xp.where(descending >= kth, descending, -xp.inf)                # top_k kept a prefix of it
    # top_p's probabilities, renormalised over what top_k kept. The normaliser is summed over the whole row in token
    # order, so it is the same number whatever width the batch needed: a row never depends on its neighbours.
    row_max = descending[:, :1]                                                  # (B, 1)
    total = xp.where(masked >= kth, xp.exp(masked - row_max), 0).sum(axis=-1, keepdims=True)   # (B, 1)
    probs = xp.exp(descending - row_max) / total                                 # (B, W)
    cumulative = xp.cumsum(probs, axis=-1)
    if width < V and any(top_p_only):
        short = xp.asarray(top_p_only)[:, None] & (cumulative[:, -1:] < top_p)  # (B, 1) prefix misses top_p
        if bool(short.any()):
            return _top_k_top_p_mask(masked, params, width=V)
    before = xp.concatenate([xp.zeros((B, 1), dtype=probs.dtype), cumulative[:, :-1]], axis=-1)  # mass ahead
    last = (before < top_p).sum(axis=-1, keepdims=True) - 1                      # (B, 1) last position top_p keeps
    boundary = xp.where(top_p_on, xp.take_along_axis(descending, last, axis=-1), -xp.inf)  # (B, 1) top_p threshold
    # max(): when float32 rounding leaves the kept mass a hair under top_p, `boundary` is a removed (-inf) slot
    # and top_p keeps everything; the top_k threshold must still hold then.
    return masked >= xp.maximum(kth, boundary)


def draw_from(probs, generator) -> int:
    """One token drawn from probs (V,) with one uniform from `generator`: the draw sample() makes, for callers with a
    distribution of their own (the speculative drafters and the accept-or-resample step)."""
    return int(_inverse_cdf(probs[None], [generator.random()])[0])


def _inverse_cdf(probs, uniforms: Sequence[float]) -> np.ndarray:
    """Draw one token per row: the first token id whose cumulative probability exceeds u * total.

    probs (S, V), uniforms S floats in [0, 1) -> (S,) int64 on the host. Token j is returned for u in
    [cdf[j-1], cdf[j]) / total, an interval of width probs[j] / total, so the draw is exact up to float32 rounding
    of the cumulative sum; a token of probability 0 has an empty interval and is never returned.
    """
    xp = array_module(probs)
    cdf = xp.cumsum(probs, axis=-1)                                              # (S, V) in token-id order
    total = cdf[:, -1:]                                                          # (S, 1) ~1
    target = xp.asarray(uniforms, dtype=probs.dtype)[:, None] * total            # (S, 1)
    token = (cdf <= target).sum(axis=-1)                                         # (S,) first cdf above target
    # u rounded up to 1.0 in float32 would point past the end: clamp to the last token that adds mass.
    last = (cdf < total).sum(axis=-1)                                            # (S,)
    return to_host(xp.minimum(token, last)).astype(INDEX_DTYPE)


# --- log-probabilities ------------------------------------------------------------------------------------------

def compute_logprobs(logits, token_ids, k: int) -> list[dict]:
    """vLLM's default logprobs: log-softmax of the RAW logits (before penalties and temperature).

    logits (B, V), token_ids (B,) the tokens chosen -> one dict per row: {"token_id": int, "logprob": float,
    "top": [[id, logprob], ...]} with the k most probable tokens, most probable first, ties by lower id.
    """
    xp = array_module(logits)
    B, V = logits.shape
    token_ids = np.asarray(token_ids if isinstance(token_ids, (list, tuple, np.ndarray)) else to_host(token_ids),
                           dtype=INDEX_DTYPE).reshape(B)                        # (B,) on the host
    shifted = logits - logits.max(axis=-1, keepdims=True)                        # (B, V)
    logprobs = shifted - xp.log(xp.exp(shifted).sum(axis=-1, keepdims=True))     # (B, V) log-softmax
    chosen = to_host(logprobs[xp.arange(B), xp.asarray(token_ids)])              # (B,)
    k = min(int(k), V)
    tops: list[list[list]] = [[] for _ in range(B)]                             # row b: [[token id, log-prob]]
    if k > 0:
        kth = -xp.partition(-logprobs, k - 1, axis=-1)[:, k - 1:k]              # (B, 1) k-th largest log-prob
        for b in range(B):
            # the candidates: every token at least as probable as the k-th (ties included), usually exactly k
            candidates = xp.nonzero(logprobs[b] >= kth[b])[0]                    # ascending ids
            ids, values = to_host(candidates), to_host(logprobs[b][candidates])
            order = np.argsort(-values, kind="stable")[:k]                      # most probable first, ties: lower id
            tops[b] = [[int(ids[i]), float(values[i])] for i in order]
    return [{"token_id": int(token_ids[b]), "logprob": float(chosen[b]), "top": tops[b]} for b in range(B)]

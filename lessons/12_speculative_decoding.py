"""Lesson 12: speculative decoding — guess k tokens cheaply, check them all in one pass of the model.

    python lessons/12_speculative_decoding.py [--tokens 32] [--ks 1,2,4] [--drafters ngram,self:20]
                                              [--draft-model PATH] [--repeats 3]
                                              [--figure figures/speculative_speedup.png]

Speculation pays when one pass over k+1 tokens costs about as much as a pass over one (true on a GPU, where decode
waits on memory) and the guesses are often right (text that repeats what the prompt already holds). This lesson
measures both factors on this machine apart from the generations: the cost of a pass over 1, 2, ... k+1 tokens and
of one drafting pass, timed in turns (table 1). It then times plain and speculative greedy generation, also in turns,
checks that the output is token for token the same, and puts the measured speedup next to a model that knows only
the acceptance rate a and table 1 (Leviathan et al., 2023): a pass with d drafts yields (1 - a^(d+1)) / (1 - a)
tokens on average and costs table 1's (d+1)-token pass plus d drafting passes, so

    predicted speedup = expected tokens per pass / (verify steps + draft steps)      (in 1-token decode steps)

It works the same model out for an H200 from its published peaks, and then checks the sampled case, where the output
cannot be the same tokens but must have the same distribution: a draft x ~ q is kept with probability
min(1, p(x) / q(x)), otherwise a token is drawn from max(p - q, 0) renormalised, and 10,000 such tokens are compared
with the target's own distribution p. The lesson's claims (claims() below) are decided from the numbers it prints; a
claim about time is stated only when it holds beyond the measured spread on a quiet run
(minitransformer/lab/measure.py).

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import os
import platform
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, SamplingParams, generate, load_model
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.prefill import prefill
from minitransformer.lab.claims import Claim, find_numbers, report, table_with, to_float
from minitransformer.lab.machine import H200
from minitransformer.lab.measure import Probe, Timing, interleaved
from minitransformer.lab.viz_concepts import SPEC_K, SPEC_PARAMS, SPEC_PROMPT
from minitransformer.speculative import speculative_runner
from minitransformer.speculative.acceptance import accept_or_resample, processed_probs

PROMPTS = {
    "repeat": SPEC_PROMPT,          # the list the prompt holds; figures/draft_and_verify.png draws this prompt's run
    "code": "def area_square(side):\n    return side * side\n\n\ndef area_rectangle(width, height):\n"
            "    return width * height\n\n\ndef area_",
    "free": "Once upon a time, in a small village by the sea, there lived an old lighthouse keeper who",
}
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read table 1 first. `x a 1-token step` is what a pass over more tokens costs next to a pass over one.",
    "In table 2, `accepted` and `tok/pass` say how many drafts were kept.",
    "`speedup` is plain decoding's ms/token over this row's. The claim lines say if it beat the spread.",
    "Table 2b predicts each speedup from the acceptance and table 1 alone. Compare it with `measured`.",
)

console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
EXPLAINED = 0.20        # the model explains a row when it predicts the measured speedup within 20% (beyond spread)


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Timings are repeated in turns: a timing claim holds only when the ranges
    [fastest, slowest] of the two sides do not overlap, and never from a single run (no spread to judge by)."""
    runs, = find_numbers(output, r"plain and every speculative setting run (\d+) times? in turns")
    several = runs >= 2                                     # table 1 times each pass 3x as often: always several
    passes = table_with(output, "tokens in the pass")
    sizes = passes.numbers("tokens in the pass")
    fastest, spread = passes.numbers("ms per pass"), passes.numbers("spread")
    one, big = sizes.index(1), len(sizes) - 1
    mm = find_numbers(output, r"check matmul .*?: 1 row ([\d.]+) us \(median [\d.]+, spread ([\d.]+)\), 2 rows "
                              r"([\d.]+) us \(median [\d.]+, spread ([\d.]+)\)")
    greedy = table_with(output, "same")
    rows = []                            # (prompt, drafter, k, same, a, tok/pass, ms/token fastest, spread)
    for row in greedy.rows:
        cell = dict(zip(greedy.columns, row))
        numbers = [to_float(cell[c]) if cell["drafter"] != "plain" else 1.0 for c in ("a", "tok/pass")]
        rows.append((cell["prompt"], cell["drafter"], cell["k"], cell["same"], *numbers, to_float(cell["ms/token"]),
                     to_float(cell["spread"])))
    plain = {r[0]: (r[6], r[7]) for r in rows if r[1] == "plain"}                  # prompt -> (fastest, spread) ms
    spec = [r for r in rows if r[1] != "plain"]
    won = [r for r in spec if r[6] + r[7] < plain[r[0]][0]]                   # slowest spec < fastest plain
    lost = [r for r in spec if r[6] > sum(plain[r[0]])]                       # fastest spec > slowest plain
    best = max(spec, key=lambda r: plain[r[0]][0] / r[6])
    model = table_with(output, "predicted")
    fits = []
    for (name, drafter, k), predicted in zip(zip(model.column("prompt"), model.column("drafter"), model.column("k")),
                                             model.numbers("predicted")):
        r = next(r for r in spec if r[:3] == (name, drafter, k))
        point = plain[name][0] / r[6]                                            # the fastest runs' speedup
        lo, hi = plain[name][0] / (r[6] + r[7]), sum(plain[name]) / r[6]         # its range over the runs
        fits.append((abs(predicted / point - 1) <= EXPLAINED or lo <= predicted <= hi,
                     hi / lo <= (1 + EXPLAINED) / (1 - EXPLAINED), name, drafter, k, predicted, lo, hi))
    missed = [f for f in fits if not f[0]]      # off by > EXPLAINED from the fastest runs, and outside their range
    noisy = [f for f in fits if not f[1]]       # the runs vary more than the band: said in the evidence
    worst = (missed or noisy or fits)[0]
    lookup = {(r[0], r[2]): r[5] for r in spec if r[1] == "ngram"}
    ks = sorted({k for _, k in lookup}, key=int)
    selfs = [r for r in spec if r[1].startswith("self:")]
    tvs = table_with(output, "TV(speculative")
    tv, bound = tvs.numbers("TV(speculative"), tvs.numbers("bound")
    needs = "" if several else "; one run has no spread to judge by"
    found = [
        Claim("same-tokens", "speculative greedy produces exactly plain greedy's tokens",
              all(r[3] == "yes" for r in spec), f"{sum(r[3] == 'yes' for r in spec)} of {len(spec)} runs identical",
              timed=False),
        Claim("verify-costs-more", f"on this machine a pass over {sizes[big]:.0f} tokens costs more than a 1-token "
              "step", fastest[big] > fastest[one] + spread[one],
              f"fastest {fastest[big]:.1f} ms vs the 1-token step's slowest {fastest[one] + spread[one]:.1f} ms"),
        Claim("matmul-jump", "one matmul with 2 rows costs more than twice the 1-row one (more than the arithmetic)",
              mm[2] > 2 * (mm[0] + mm[1]),
              f"2 rows fastest {mm[2]:.0f} us vs twice the 1 row's slowest, {2 * (mm[0] + mm[1]):.0f} us"),
        Claim("model-explains", f"acceptance and table 1's pass costs predict every measured speedup within "
              f"{EXPLAINED:.0%} (or inside its runs' range)", several and not missed,
              f"{len(fits) - len(missed)} of {len(fits)} rows within {EXPLAINED:.0%}, {len(noisy)} whose runs vary "
              f"more than that band (-{EXPLAINED:.0%} to +{EXPLAINED:.0%}); "
              f"{'off' if missed else 'varying' if noisy else 'e.g.'}: {worst[2]}/{worst[3]}/"
              f"k={worst[4]}: predicted {worst[5]:.2f}x, measured {worst[6]:.2f}-{worst[7]:.2f}x" + needs),
        Claim("spec-won", "some speculative run was faster than plain decoding beyond the spread",
              several and bool(won),
              f"best {best[0]}/{best[1]}/k={best[2]}: {best[6]:.1f} ms/token (spread {best[7]:.1f}) vs plain "
              f"{plain[best[0]][0]:.1f} ms{needs}", required=False,         # won or lost: the machine answers
              refuted=several and len(lost) == len(spec)),
        Claim("spec-lost", "every speculative run was slower than plain decoding beyond the spread",
              several and len(lost) == len(spec),
              f"{len(lost)} of {len(spec)} runs slower than their plain run's slowest{needs}", required=False,
              refuted=several and bool(won)),
        Claim("sampled-matches", "speculative sampling draws from the target's distribution p (TV within the bound at "
              "every temperature)", all(t <= b for t, b in zip(tv, bound)),
              ", ".join(f"{t:.4f} <= {b:.4f}" for t, b in zip(tv, bound)), timed=False),
    ]
    if ks and ("repeat", ks[0]) in lookup and ("free", ks[0]) in lookup:      # prompts and drafter in this run
        found.insert(1, Claim(
            "lookup-likes-repeats", "n-gram lookup yields more tokens per pass on text the prompt holds than on free "
            "text, at every k", all(lookup["repeat", k] > lookup["free", k] for k in ks),
            ", ".join(f"k={k}: {lookup['repeat', k]:.2f} vs {lookup['free', k]:.2f}" for k in ks), timed=False))
    if selfs:
        top = max(selfs, key=lambda r: r[4])
        found.insert(-5, Claim("self-rarely-agrees", "early-exit drafts (self:L) are kept less than half the time",
                              top[4] < 0.5, f"highest acceptance {top[4]:.2f} ({top[0]}, k={top[2]})", timed=False))
    return found


def pass_costs(model, draft, drafters, ids, sizes, repeats) -> dict[str, Timing]:
    """One cached forward pass of the target over T new tokens for each T in sizes (a verify pass with d drafts is
    T = d + 1), and one drafting pass of each drafter that runs a model, all timed in turns; each is rolled back
    after it runs, as a rejection rolls back, so every repeat sees the same context."""
    xp = model.xp
    cache = KVCache(model.config, len(ids) + max(sizes))
    prefill(model, ids, cache)
    base = cache.length

    def verify(T):
        def run():
            model.forward(xp.asarray(ids[:T])[None], xp.arange(base, base + T)[None], cache)     # (1, T, V)
            cache.truncate(base)
        return run

    def drafting(net, layers, own_cache):
        def run():
            net.forward(xp.asarray(ids[:1])[None], xp.arange(base, base + 1)[None], own_cache, layers=layers,
                        last_only=True)                                                          # (1, V)
            own_cache.truncate(base)
        return run

    runs = {f"verify {T}": verify(T) for T in sizes}
    for name in drafters:
        if name.startswith("self:"):                    # the first L layers write into the target's cache
            runs[f"draft {name}"] = drafting(model, int(name.split(":")[1]), cache)
        elif name in ("model", "same"):                 # a whole model with a cache of its own
            net = draft if name == "model" else model
            own = KVCache(net.config, len(ids) + 1)
            prefill(net, ids, own)
            runs[f"draft {name}"] = drafting(net, None, own)
    return interleaved(runs, repeats=repeats)


def matmul_rows(model, sizes, repeats) -> dict[int, Timing]:
    """x (T, D) @ w_gate_up (D, 2F) for each T, in turns: the same weights read, T times the arithmetic."""
    w = model.layers[0].w_gate_up                                                  # (576, 3072)
    xs = {T: model.xp.ones((T, w.shape[0]), dtype=w.dtype) for T in sizes}         # (T, D)
    timed = interleaved({str(T): (lambda x=x: x @ w) for T, x in xs.items()}, repeats=repeats)
    return {T: timed[str(T)] for T in sizes}


def us(t: Timing) -> str:
    """A matmul's Timing in microseconds: it takes well under a millisecond."""
    return f"{t.min * 1e6:.0f} us (median {t.median * 1e6:.0f}, spread {t.spread * 1e6:.0f})"


def expected_tokens(d: int, a: float) -> float:
    """Tokens a pass with d drafts yields when each draft is kept with probability a, independently, until the first
    rejection; the pass then adds the target's own token: 1 + a + ... + a^d (Leviathan et al.)."""
    return d + 1.0 if a >= 1 else (1 - a ** (d + 1)) / (1 - a)


def predict(drafts: list[int], a: float, verify_steps, draft_step: float) -> tuple[float, float, float]:
    """(expected tokens, verify steps, draft steps) per pass, averaged over the run's passes (d drafts each: k for a
    model drafter, 0..k for n-gram lookup, which finds no match or a short one); costs in 1-token decode steps."""
    tokens = float(np.mean([expected_tokens(d, a) for d in drafts]))
    verify = float(np.mean([verify_steps(d + 1) for d in drafts]))
    return tokens, verify, float(np.mean(drafts)) * draft_step


def sampled_check(model, layers: int, temperature: float, draws: int, seed: int) -> dict:
    """Speculative *sampling* on one fixed context, where greedy's "same tokens" check cannot apply.

    p: the full model's next-token distribution at `temperature`; q: the first `layers` layers' (the self-drafter's).
    `draws` times: draw x from q, keep it with probability min(1, p[x] / q[x]), else draw from max(p - q, 0)
    renormalised (accept_or_resample, the rule the engine uses). The tokens must be distributed as p: their
    total-variation distance to p should be as small as that of `draws` plain draws from p, and below the bound
    E[TV] <= 1/2 sum_i sqrt(p_i (1 - p_i) / N) (Jensen on each |count/N - p_i|) plus a margin t with
    P(TV > E[TV] + t) <= exp(-2 N t^2) (McDiarmid: one draw moves TV by at most 1/N); t = sqrt(ln(1000) / 2N).
    """
    ids = model.tokenizer.encode(PROMPTS["free"])
    params = SamplingParams(temperature=temperature, max_tokens=1)
    positions = np.arange(len(ids))[None]
    target = model.forward(np.array([ids]), positions, last_only=True)                  # (1, V)
    draft = model.forward(np.array([ids]), positions, layers=layers, last_only=True)     # (1, V): L layers
    p = processed_probs(target, params, ids, [], model.tokenizer.eos_id).astype(np.float64)   # (V,)
    q = processed_probs(draft, params, ids, [], model.tokenizer.eos_id).astype(np.float64)    # (V,)
    p, q = p / p.sum(), q / q.sum()
    rng = np.random.default_rng(seed)
    q_cdf = np.cumsum(q)
    spec, accepted = np.zeros_like(p), 0
    for _ in range(draws):
        x = min(int(np.searchsorted(q_cdf, rng.random() * q_cdf[-1], side="right")), len(q) - 1)
        token = accept_or_resample(p, q, x, rng)
        accepted += token == x          # kept (a redraw that lands on x again counts too: a tiny overcount)
        spec[token] += 1
    plain = np.bincount(rng.choice(len(p), size=draws, p=p), minlength=len(p))
    tv = lambda a, b: 0.5 * float(np.abs(a - b).sum())
    bound = 0.5 * float(np.sqrt(p * (1 - p) / draws).sum()) + float(np.sqrt(np.log(1000) / (2 * draws)))
    return {"temperature": temperature, "accept": accepted / draws, "overlap": float(np.minimum(p, q).sum()),
            "tv_spec": tv(spec / draws, p), "tv_plain": tv(plain / draws, p), "bound": bound, "tv_draft": tv(q, p)}


def h200_steps(config, tokens: int, context: int, target_config) -> float:
    """Roofline time of a `tokens`-token pass of `config` on an H200, in one-token steps of the target: close to
    1 for a (k + 1)-token verify pass, because at bf16 the pass waits on reading the same weights either way."""
    return H200.seconds(H200.cost(config, tokens, context)) / H200.seconds(H200.cost(target_config, 1, context))


def draft_config(model, drafter: str, draft):
    """The model a drafter runs once per drafted token (None: n-gram lookup runs no model)."""
    if drafter == "ngram":
        return None
    if drafter.startswith("self:"):
        return replace(model.config, n_layers=int(drafter.split(":")[1]))   # the first L layers + the lm_head
    return (draft if drafter == "model" else model).config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=SPEC_PARAMS.max_tokens, help="new tokens per request")
    ap.add_argument("--ks", default="1,2,4", help="num_speculative_tokens values (k=8 is slow here: --ks 1,2,4,8)")
    ap.add_argument("--drafters", default="ngram,self:20", help="ngram, self:L, model (needs --draft-model), same "
                                                                "(the model drafts for itself)")
    ap.add_argument("--prompts", default="repeat,code,free", help="repeat (a list the prompt holds), code, free")
    ap.add_argument("--draft-model", help="a GGUF with the same vocabulary, for the 'model' drafter")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of every generation, in turns (table 1 "
                                                           "times each pass 3x as often: a pass is short)")
    ap.add_argument("--figure", help="write speedup and acceptance vs k to this PNG")
    ap.add_argument("--draws", type=int, default=10_000, help="draws per temperature in the sampled check (3.)")
    ap.add_argument("--temperatures", default="0.7,1.0,1.5", help="temperatures of the sampled check")
    ap.add_argument("--draft-layers", type=int, default=28,
                    help="layers of the self-drafter in the sampled check (28 of 30 agree often enough to show both "
                         "acceptance and the redraw)")
    args = ap.parse_args()
    ks, drafters = [int(k) for k in args.ks.split(",")], args.drafters.split(",")
    if args.repeats < 1 or args.tokens < 2 or min(ks) < 1:
        raise InputError("--repeats and --ks values must be at least 1, --tokens at least 2")
    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?
    draft = load_model(args.draft_model) if args.draft_model else None
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0)
    specs = {drafter: {"model": draft, "same": model}.get(drafter, drafter) for drafter in drafters}

    # 1. What does a verify pass cost, and a drafting pass? Measured apart from the generations, in turns. -----------
    ids = model.tokenizer.encode(PROMPTS["free"])
    sizes = list(range(1, max(ks) + 2))                     # a verify pass carries d + 1 tokens, d = 0 .. k drafts
    cost = pass_costs(model, draft, drafters, ids, sizes, 3 * args.repeats)
    step = cost["verify 1"].min                                         # one plain decode step: the unit below
    mm = matmul_rows(model, sizes, 12 * args.repeats)
    w = model.layers[0].w_gate_up
    table = Table("tokens in the pass", "ms per pass", "median", "spread", "x a 1-token step", "ms per token",
                  f"one matmul (T, {w.shape[0]}) @ ({w.shape[0]}, {w.shape[1]}): x T=1")
    for T in sizes:
        t = cost[f"verify {T}"]
        table.add_row(str(T), f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}",
                      f"{t.min / step:.2f}", f"{t.min * 1e3 / T:.1f}", f"{mm[T].min / mm[1].min:.2f}")
    console.print(f"1. one forward pass of the target with {len(ids)} tokens cached, each timed {3 * args.repeats} "
                  "times in turns after a warm-up; ms per pass = the fastest run, the figure a quiet machine gives "
                  "(noise only ever adds time), with the median and the spread (slowest - fastest) beside it", table)
    console.print(f"check matmul ({12 * args.repeats} runs each, in turns): 1 row {us(mm[1])}, 2 rows {us(mm[2])}, "
                  f"{sizes[-1]} rows {us(mm[sizes[-1]])}", highlight=False)
    draft_steps = {}                                    # drafter -> one drafting pass, in 1-token decode steps
    for drafter in drafters:
        t = cost.get(f"draft {drafter}")
        if t is None:
            draft_steps[drafter] = 0.0
            console.print(f"check draft pass: {drafter}: a lookup in the context, no model pass: counted as free")
            continue
        draft_steps[drafter] = t.min / step
        what = (f"one token through the first {drafter.split(':')[1]} of {model.config.n_layers} layers and the "
                "lm_head" if drafter.startswith("self:") else "one token through the whole draft model")
        console.print(f"check draft pass: {drafter}: {what}: {t.ms()} = {t.min / step:.2f} x a 1-token step")

    # 2. Plain greedy vs speculative greedy: same tokens; ms per token timed in turns ------------------------------
    for drafter in drafters:                             # warm-up: first-call costs of each drafter's code path
        generate(model, PROMPTS["free"], SamplingParams(max_tokens=4, temperature=0.0),
                 runner=speculative_runner(specs[drafter], max(ks)))
    measured, model_rows, counts = [], [], {}
    table = Table("prompt", "drafter", "k", "same", "accepted", "a", "tok/pass", "ms/token", "median", "spread",
                  "speedup")
    for name in args.prompts.split(","):
        outs = time_generations(model, PROMPTS[name], params, specs, ks, args.repeats)
        plain_t = outs["plain"][1]
        plain = outs["plain"][0]
        table.add_row(name, "plain", "-", "-", "-", "-", "1.00", f"{plain_t.min * 1e3:.1f}",
                      f"{plain_t.median * 1e3:.1f}", f"{plain_t.spread * 1e3:.1f}", "1.00")
        for drafter in drafters:
            for k in ks:
                results, t = outs[f"{drafter} k={k}"]
                out, s = results[0], results[0].speculative
                same = all(r.token_ids == plain[0].token_ids for r in results + plain)
                counts[name, drafter, k] = (s["accepted_tokens"], s["draft_tokens"], s["target_passes"])
                a = s["acceptance_rate"] or 0.0
                per_pass = (len(out.token_ids) - 1) / (s["target_passes"] - 1)       # the prefill is common to both
                speedup = plain_t.min / t.min
                drafts = [len(p[0]) for p in s["passes"][1:]]                       # drafts proposed per pass
                measured.append((name, drafter, k, speedup, a))
                model_rows.append((name, drafter, k, a, drafts, per_pass, speedup,
                                   out.usage.prompt_tokens + len(out.token_ids) // 2))
                table.add_row(name, drafter, str(k), "yes" if same else "NO",
                              f"{s['accepted_tokens']}/{s['draft_tokens']}", f"{a:.2f}", f"{per_pass:.2f}",
                              f"{t.min * 1e3:.1f}", f"{t.median * 1e3:.1f}", f"{t.spread * 1e3:.1f}", f"{speedup:.2f}")
    console.print(f"2. greedy, {args.tokens} new tokens; per prompt, plain and every speculative setting run "
                  f"{args.repeats} time{'s' * (args.repeats != 1)} in turns. same = identical to plain greedy in "
                  "every run; accepted = drafts kept / drafts checked (a draft after a rejection is never checked); "
                  "a = their ratio; tok/pass = tokens per verify pass; ms/token = decode time per token (fastest "
                  "run; median; spread); speedup = plain's fastest ms/token / this row's", table)
    if "repeat" in args.prompts.split(",") and "ngram" in drafters and SPEC_K in ks and args.tokens == \
            SPEC_PARAMS.max_tokens:
        accepted, checked, passes = counts["repeat", "ngram", SPEC_K]
        console.print(f"figures/draft_and_verify.png draws the repeat / ngram / k={SPEC_K} run above pass by pass: "
                      f"{args.tokens} tokens in {passes} target passes, {accepted}/{checked} drafts accepted (greedy: "
                      "the same run, the same counts)")

    # 2b. The model: acceptance and table 1's costs, nothing timed in section 2 ------------------------------------
    table = Table("prompt", "drafter", "k", "drafts per pass", "tok/pass formula", "tok/pass measured",
                  "verify steps", "draft steps", "predicted", "measured", "H200 predicted")
    predictions = {}
    for name, drafter, k, a, drafts, per_pass, speedup, context in model_rows:
        tokens, verify, drafting = predict(drafts, a, lambda T: cost[f"verify {T}"].min / step, draft_steps[drafter])
        config = draft_config(model, drafter, draft)
        h_draft = 0.0 if config is None else h200_steps(config, 1, context, model.config)
        h200_verify = lambda T, context=context: h200_steps(model.config, T, context, model.config)
        h_tokens, h_verify, h_drafting = predict(drafts, a, h200_verify, h_draft)
        predicted, gpu = tokens / (verify + drafting), h_tokens / (h_verify + h_drafting)
        predictions[name, drafter, k] = (tokens, verify, drafting, predicted, gpu)
        table.add_row(name, drafter, str(k), f"{np.mean(drafts):.2f}", f"{tokens:.2f}", f"{per_pass:.2f}",
                      f"{verify:.2f}", f"{drafting:.2f}", f"{predicted:.2f}", f"{speedup:.2f}", f"{gpu:.2f}")
    console.print("2b. the speedup predicted from the acceptance a and table 1 alone, in 1-token decode steps: a "
                  "pass with d drafts yields (1 - a^(d+1)) / (1 - a) tokens when each draft is kept with "
                  "probability a until the first rejection (Leviathan et al.), and costs table 1's (d+1)-token pass "
                  "+ d drafting passes; predicted = tok/pass formula / (verify + draft steps), averaged over the "
                  "run's passes (d = k for a model drafter; n-gram lookup often finds fewer drafts, or none). "
                  f"measured: table 2's speedup. H200: the same passes on an {H200.name} ({H200.bandwidth / 1e12:.1f} "
                  f"TB/s, {H200.flops / 1e12:.0f} TFLOP/s dense {H200.dtype}) at their roofline times: a pass that "
                  "waits on reading the weights costs about one step whatever its d + 1 tokens, and each self:L "
                  "drafting pass the share of one its weights are (L layers and the lm_head)", table)

    # 3. Sampling: the same distribution, not the same tokens ------------------------------------------------------
    table = Table("temperature", "accepted", "sum min(p, q)", "TV(speculative, p)", "TV(plain, p)", "bound",
                  "TV(q, p)")
    checks = [sampled_check(model, args.draft_layers, float(t), args.draws, seed=i)
              for i, t in enumerate(args.temperatures.split(","))]
    for c in checks:
        table.add_row(f"{c['temperature']:.2f}", f"{c['accept']:.3f}", f"{c['overlap']:.3f}", f"{c['tv_spec']:.4f}",
                      f"{c['tv_plain']:.4f}", f"{c['bound']:.4f}", f"{c['tv_draft']:.4f}")
    console.print(f"3. sampled: {args.draws} next tokens after the 'free' prompt, drafted by the first "
                  f"{args.draft_layers} layers (q) and accepted or redrawn against the full model (p). accepted = "
                  "drafts kept, expected sum min(p, q); TV = total-variation distance of the drawn tokens' "
                  "frequencies to p, for speculative and for plain sampling; bound = what N draws from p stay under "
                  "(999 times in 1000); TV(q, p): what keeping every draft would give", table)

    if args.figure:
        draw(args.figure, measured, predictions, model, args.tokens)
        console.print(f"figure written: {args.figure}")

    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)
    answer(shown, measured, predictions, cost, step, mm, ks, args.repeats)


def time_generations(model, prompt, params, specs, ks, repeats) -> dict[str, tuple[list, Timing]]:
    """Plain greedy and every (drafter, k), each run `repeats` times in turns (a busy moment slows all of them
    alike); per setting its results and the Timing of its decode seconds per token (prefill left out: it is the
    same pass in both)."""
    settings = {"plain": {}} | {f"{drafter} k={k}": {"runner": speculative_runner(spec, k)}
                                for drafter, spec in specs.items() for k in ks}
    results = {name: [] for name in settings}

    def run(name):
        return lambda: results[name].append(generate(model, prompt, params, **settings[name]))

    interleaved({name: run(name) for name in settings}, repeats=repeats, warmup=0)   # warmed up in main()
    return {name: (rs, Timing(tuple(r.metrics.tpot_s for r in rs))) for name, rs in results.items()}


def draw(path, measured, predictions, model, tokens) -> None:
    """Speedup (fastest runs) and acceptance against k, one colour per (prompt, drafter): the measured speedup as
    dots, section 2b's prediction from acceptance and table 1 dashed beside it, the H200's prediction dotted: where
    the dotted line is above 1 and the measured one below, the machine, not the method, made the difference."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5.2))
    for i, (name, drafter) in enumerate(dict.fromkeys((r[0], r[1]) for r in measured)):
        mine = [r for r in measured if r[:2] == (name, drafter)]
        ks, colour = [r[2] for r in mine], f"C{i}"
        ax1.plot(ks, [r[3] for r in mine], "o-", color=colour, label=f"{name}, {drafter}: measured")
        ax1.plot(ks, [predictions[name, drafter, k][3] for k in ks], "--", color=colour, alpha=0.7)
        ax1.plot(ks, [predictions[name, drafter, k][4] for k in ks], ":", color=colour, alpha=0.9)
        ax2.plot(ks, [r[4] for r in mine], "o-", color=colour, label=f"{name}, {drafter}")
    ax1.plot([], [], "k--", alpha=0.7, label="predicted here (2b: acceptance, table 1's pass costs)")
    ax1.plot([], [], "k:", label=f"predicted on an {H200.name} (roofline pass costs)")
    ax1.axhline(1.0, color="gray", lw=0.8)
    ax1.set(xlabel="k (drafted tokens per pass)", ylabel="speedup over plain decode (fastest runs)",
            title="speedup: measured, predicted here, predicted on an H200")
    ax1.set_yscale("log")
    ax1.legend(fontsize=7, loc="best")
    ax2.set(xlabel="k (drafted tokens per pass)", ylabel="accepted / checked", title="acceptance", ylim=(0, 1.05))
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))           # k is a count of drafts
    fig.suptitle(f"Speculative decoding: speedup and acceptance against k, one colour per prompt and drafter\n"
                 f"speedup = plain decode's time per token / speculative decoding's; above the grey line speculation "
                 f"pays, below it it costs\n"
                 f"{model.path.name}, greedy, {tokens} new tokens; measured on {platform.machine()}, "
                 f"{os.cpu_count()} cores ({model.device})", fontsize=9.5)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def answer(shown, measured, predictions, cost, step, mm, ks, repeats) -> None:
    """The interview answer: every direction it states is a claim this run showed."""
    best = max(measured, key=lambda r: r[3])
    k_big = max(ks)
    tokens, verify, drafting, predicted, gpu = predictions[best[:3]]
    console.rule("[bold]Interview question: when does speculative decoding make generation faster, and what did it "
                 "do here?")
    same = (" (every run above produced plain greedy's tokens)." if shown["same-tokens"] else
            ". This run's output did change, which is a bug. See the claims above.")
    text = ["It never changes greedy output" + same
            + " It changes the cost per token to (verify pass + drafting) / tokens per pass."]
    if shown["verify-costs-more"]:
        text.append(f"Here a pass over {k_big + 1} tokens cost {cost[f'verify {k_big + 1}'].min / step:.2f}x a "
                    "1-token step. So a pass must yield more than that many tokens just to break even on "
                    "verification.")
        if shown["matmul-jump"]:
            text.append(f"The price jumps at the second row. One matmul with 2 rows cost {mm[2].min / mm[1].min:.2f}x "
                        f"the same matmul with 1 row, and with {k_big + 1} rows {mm[k_big + 1].min / mm[1].min:.2f}x. "
                        "The likely reason is in NumPy's BLAS. It multiplies one row with a matrix-vector routine. "
                        "Several rows go to a matrix-matrix routine that first copies the weights into blocks.")
    else:
        text.append(f"This run could not show what a {k_big + 1}-token pass costs against a 1-token step beyond its "
                    "spread (table 1); its claim line says whether the runs overlapped or the machine was busy.")
    if shown["spec-won"]:
        verdict = (f"won. {best[0].capitalize()} text with {best[1]} at k={best[2]} decoded {best[3]:.2f}x as fast "
                   "as plain decoding")
    elif shown["spec-lost"]:
        verdict = (f"lost everywhere. Even the best setting ({best[0]} text, {best[1]}, k={best[2]}) reached only "
                   f"{best[3]:.2f}x of plain decoding's speed")
    else:
        verdict = (f"could not be told apart from plain decoding beyond the spread of {repeats} runs (best: {best[0]}, "
                   f"{best[1]}, k={best[2]}, {best[3]:.2f}x)")
    text.append(f"So on this machine speculation {verdict}.")
    if shown["model-explains"]:
        text.append(f"The model of 2b explains it without looking at section 2's clock. Acceptance {best[4]:.2f} "
                    f"gives {tokens:.2f} tokens per pass for {verify:.2f} + {drafting:.2f} steps of verify and draft "
                    f"work. That predicts {predicted:.2f}x, and the run measured {best[3]:.2f}x. And on an H200, where "
                    f"the verify pass costs about one step, the same acceptance predicts {gpu:.2f}x.")
    else:
        text.append(f"The model of 2b predicted {predicted:.2f}x for that setting, and the run measured "
                    f"{best[3]:.2f}x. This run could not show that the model explains every row. The claims above say "
                    f"which. On an H200 the same acceptance predicts {gpu:.2f}x.")
    text.append("A (k+1)-token pass can cost about one step, as when a decode step waits on memory on a GPU. There the "
                "same acceptance buys nearly its tokens per pass in speed. Where the pass costs several steps, only "
                "drafts that are free and usually right can come close.")
    if shown.get("lookup-likes-repeats"):
        text.append("N-gram lookup is such a drafter on text the prompt already holds. It yielded more tokens per "
                    "pass on the repeated list than on free text at every k.")
    if shown.get("self-rarely-agrees"):
        text.append("Early-exit drafts (self:L) were kept less than half the time. The first L layers' hidden state "
                    "was never trained to be read by the lm_head.")
    if shown["sampled-matches"]:
        text.append("With sampling the tokens differ from plain sampling's, but their distribution does not. The "
                    "speculative draws of section 3 were as close to p as N plain draws stay (TV within the bound). "
                    "A rejected draft is redrawn from max(p - q, 0). That makes up the difference TV(q, p) that "
                    "keeping every draft would leave.")
    console.print(" ".join(text))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

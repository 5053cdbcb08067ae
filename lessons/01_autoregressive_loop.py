"""Lesson 01: the autoregressive loop — the model predicts one token, the token is appended, and only then can the
next one be predicted.

    python lessons/01_autoregressive_loop.py [--prompt TEXT] [--tokens 24] [--temperature 0] [--seed 0] [--repeats 3]

The loop below is the decode loop in miniature (logits -> sampler -> append -> stop check), made of the library's
stage functions: prefill.py, decode.py, sampling.py, detokenizer.py, stopping.py. generate.py runs the same loop.
Try --tokens 200: token 200 still waits for token 199, one full pass through the model each.
The lesson's claims (claims() below) are decided from the numbers it prints; a claim about time is stated only when
it holds beyond the measured spread on a quiet machine (minitransformer/lab/measure.py), otherwise the lesson says that
this run could not show it.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import KVCache, SamplingParams, load_model
from minitransformer.core.decode import decode_step
from minitransformer.core.detokenizer import IncrementalDetokenizer
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.metrics import now
from minitransformer.core.prefill import prefill
from minitransformer.core.sampling import compute_logprobs, make_generator, sample
from minitransformer.core.stopping import check_stop
from minitransformer.lab.claims import NUMBER, Claim, find_numbers, report
from minitransformer.lab.measure import Probe, interleaved

PROMPT = "The printing press changed Europe because"
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's table first. Each row is one pass through the model, and `pos` rises by one per row.",
    "In section 2, the `check dependency` line says whether forcing one token changed the token after it.",
    "In section 3, the `check timing` line compares the loop's passes with one pass over the known answer.",
    "Each claim line under 'What this run shows' says whether this run showed it.",
)
console = Console(width=None if sys.stdout.isatty() else 120, record=True)   # piped: 120 columns; record: claims()
SAME_LOGPROB = 1e-4         # float32 sums in another order: the one pass and the loop agree to about 1e-5


def show(piece: str) -> str:
    return repr(piece)[1:-1][:12]                                  # newlines visible, long tokens cut


def table_of(rows, last=None):
    """The steps so far; the live view shows only the last rows that fit the screen, the full table comes after."""
    table = Table("step", "pos", "chosen", "top-5 candidates (probability)", "ms", "context so far (its end)")
    for row in rows[-last:] if last else rows:
        table.add_row(*row)
    return table


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from the numbers it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). Only the last claim is about time: it needs a quiet run."""
    in_order, gaps = find_numbers(output, r"check order: step n\+1 started after token n was chosen in (\d+) of "
                                          r"(\d+) steps")
    k, forced, after, was = find_numbers(output, r"check dependency: token (\d+) forced to (\d+) -> next token "
                                                 r"(\d+) \(was (-?\d+)\)")
    diff, n = find_numbers(output, rf"check parallel pass: max \|log p loop - log p one pass\| = ({NUMBER}) over "
                                   r"(\d+) tokens")
    loop_lo, loop_hi, pass_lo, pass_hi = find_numbers(output, r"check timing: loop ([\d.]+)-([\d.]+) ms, one pass "
                                                              r"([\d.]+)-([\d.]+) ms")
    return [
        Claim("in-order", "every decode step started only after the token before it was chosen (its only new input)",
              in_order == gaps, f"{in_order:.0f} of {gaps:.0f} steps", timed=False),
        Claim("next-changes", "forcing one token to another candidate changes the token after it",
              was >= 0 and after != was,
              f"token {k:.0f} forced to id {forced:.0f}: next token id {after:.0f}, "
              + (f"was {was:.0f}" if was >= 0 else "no token followed it in this run"), timed=False),
        Claim("same-probabilities", "one pass over the known answer gives the loop's probabilities",
              diff < SAME_LOGPROB, f"max |log p difference| {diff:.1e} over {n:.0f} tokens, limit {SAME_LOGPROB:.0e}",
              timed=False),
        Claim("one-pass-faster", f"scoring all {n:.0f} known tokens in one pass takes less time than the loop's "
              f"{n:.0f} passes", pass_hi < loop_lo,
              f"one pass {pass_lo:.1f}-{pass_hi:.1f} ms vs loop {loop_lo:.1f}-{loop_hi:.1f} ms (fastest-slowest)"),
    ]


def warm_up(model, prompt_ids) -> None:
    """One untimed prefill and decode step on a scratch cache: the first call of a process pays for BLAS threads
    starting, pages touched for the first time and the allocator growing, none of which is the prefill's cost."""
    scratch = KVCache(model.config, len(prompt_ids) + 1)
    decode_step(model, [int(prefill(model, prompt_ids, scratch)[0].argmax())], scratch)


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))   # the whole first sentence
    ap.add_argument("--prompt", default=PROMPT, help="text to continue")
    ap.add_argument("--tokens", type=int, default=24,
                    help="the most new tokens to generate (the loop also stops at EOS)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy: always the most probable token")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (matters only with --temperature > 0)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds of the loop vs one pass (part 3)")
    args = ap.parse_args()
    for flag, value in (("--tokens", args.tokens), ("--repeats", args.repeats)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    model = load_model()
    probe = Probe()                                                      # is the machine quiet during this run?
    tok, cfg = model.tokenizer, model.config
    prompt_ids = tok.encode(args.prompt)
    params = SamplingParams(max_tokens=args.tokens, temperature=args.temperature, seed=args.seed)
    warm_up(model, prompt_ids)
    console.rule(f"[bold]1. The loop: {len(prompt_ids)} prompt tokens, then one token per step")

    cache = KVCache(cfg, len(prompt_ids) + args.tokens)
    detok, generator = IncrementalDetokenizer(tok), make_generator(params.seed)
    out, chosen_p, chosen_at, started_at, step_s, rows = [], [], [], [], [], []
    fit = max(3, console.size.height // 2 - 4)                        # a row can wrap to two lines
    with Live(table_of(rows), console=console, auto_refresh=False, transient=True) as live:
        started_at.append(now())
        logits = prefill(model, prompt_ids, cache)                    # (1, V): the whole prompt in one pass
        while True:
            token = int(sample(logits, [params], [generator], [prompt_ids], [out])[0])    # logits -> sampler
            chosen_at.append(now())
            step_s.append(chosen_at[-1] - started_at[-1])
            top = compute_logprobs(logits, [token], 5)[0]
            chosen_p.append(float(np.exp(top["logprob"])))
            out.append(token)                                            # -> append
            new_chars = detok.add_token(token)
            candidates = "  ".join(f"{show(tok.decode([i]))} {np.exp(lp):.0%}" for i, lp in top["top"])
            position = len(prompt_ids) + len(out) - 1
            rows.append((str(len(out)), str(position), f"[bold green]{show(tok.decode([token]))}", candidates,
                         f"{step_s[-1] * 1e3:.0f}", repr(tok.decode(prompt_ids + out))[-25:-1]))
            live.update(table_of(rows, fit), refresh=True)
            decision = check_stop(params, detok, out, new_chars, tok.eos_id, len(prompt_ids), cfg.context_length)
            if decision is not None:                                     # -> stop check (EOS or max tokens)
                break
            started_at.append(now())
            logits = decode_step(model, [token], cache)                  # the new token is the next step's input
    console.print(table_of(rows))
    n = len(out)
    reason = decision.finish_reason + (f" ({decision.stop_reason!r})" if decision.stop_reason is not None else "")
    console.print(f"finished: {reason} after {n} tokens = {n} passes "
                  f"through the model (1 prefill + {n - 1} decode steps). Text: {detok.text!r}")
    console.print("ms: each step timed once, as it ran. Step 1 is the prefill. A warm-up pass ran first, so step 1 is "
                  "not charged for the process's first-call costs. Lesson 02 repeats and interleaves these timings.")
    console.print("Diagram: figures/request_flow.png, the same stages as generate() runs them (tokenize, schedule, "
                  "prefill, sample, stream and stop checks, decode, finalize), each with its file and measured time.")
    console.print(f"check ids: {out}")
    console.print("chosen-token probabilities: " + " ".join(f"{p:.4f}" for p in chosen_p))
    gaps = [started_at[i + 1] - chosen_at[i] for i in range(n - 1)]
    smallest = f" (smallest gap {min(gaps) * 1e6:.0f} us)" if gaps else ""
    console.print(f"check order: step n+1 started after token n was chosen in {sum(g > 0 for g in gaps)} of "
                  f"{len(gaps)} steps{smallest}: step n+1's only new input is token n")

    console.rule("[bold]2. Change one token and look at the token after it")
    k = max(1, n // 2)                                                    # swap the k-th token (1-based)
    prefix = prompt_ids + out[:k - 1]
    fork = KVCache(cfg, len(prefix) + 2)
    logits_k = prefill(model, prefix, fork)
    alternative = next(i for i, _ in compute_logprobs(logits_k, [out[k - 1]], 2)[0]["top"] if i != out[k - 1])
    fork_top = compute_logprobs(decode_step(model, [alternative], fork), [0], 1)[0]["top"][0]
    after_alt, p_alt = fork_top[0], float(np.exp(fork_top[1]))          # greedy next token after the swap
    if k < n:
        effect = (f"token {k + 1} is {tok.decode([after_alt])!r} (p {p_alt:.2f}), where the loop had "
                  f"{tok.decode([out[k]])!r} (p {chosen_p[k]:.2f})")
    else:
        effect = f"the next token would be {tok.decode([after_alt])!r} (p {p_alt:.2f}); the loop stopped here"
    console.print(f"token {k} was {tok.decode([out[k - 1]])!r}; forcing the most probable "
                  f"other candidate {tok.decode([alternative])!r}: {effect}")
    console.print(f"check dependency: token {k} forced to {alternative} -> next token {after_alt} "
                  f"(was {out[k] if k < n else -1})")

    console.rule("[bold]3. Scoring a known answer in one pass vs generating it pass by pass")
    every = KVCache(cfg, len(prompt_ids) + n)
    all_logits = prefill(model, prompt_ids + out[:-1], every, all_logits=True)[0]   # (P + n - 1, V): one pass
    rows = all_logits[len(prompt_ids) - 1:]                                         # (n, V): logits before each token
    parallel = compute_logprobs(rows, out, 0)
    diff = max(abs(r["logprob"] - np.log(p)) for r, p in zip(parallel, chosen_p))
    console.print(f"One forward pass over prompt + all {n} answer tokens scores every answer token at once. "
                  "Its probabilities against the loop's:")
    console.print(f"check parallel pass: max |log p loop - log p one pass| = {diff:.1e} over {n} tokens")

    def one_pass():                                                   # the pass above again
        every.truncate(0)
        prefill(model, prompt_ids + out[:-1], every, all_logits=True)

    def loop():                                                       # the loop's n passes, its tokens fed back
        cache.truncate(0)
        prefill(model, prompt_ids, cache)
        for token in out[:-1]:
            decode_step(model, [token], cache)
    times = interleaved({"loop": loop, "one pass": one_pass}, repeats=args.repeats)
    t_loop, t_pass = times["loop"], times["one pass"]
    console.print(f"Timed in turns, {args.repeats} rounds after a warm-up round. The fastest is what a quiet machine "
                  "gives, the median what you typically get, and the spread how far to trust either. The loop's "
                  f"{n} passes: {t_loop.ms()}. One pass over all {n}: {t_pass.ms()}.")
    console.print(f"check timing: loop {t_loop.min * 1e3:.1f}-{t_loop.max * 1e3:.1f} ms, one pass "
                  f"{t_pass.min * 1e3:.1f}-{t_pass.max * 1e3:.1f} ms")
    console.print("But that pass needed the answer as its input. It can verify tokens, as speculative decoding does. "
                  "It cannot produce them.")

    console.rule("[bold]4. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: is the answer generated in parallel?")
    decode_ms = 1e3 * statistics.median(step_s[1:]) if n > 1 else float("nan")
    answer = [f"No. This run produced {n} tokens with {n} passes through the model. First, the prefill read all "
              f"{len(prompt_ids)} prompt tokens at once ({step_s[0] * 1e3:.0f} ms, timed once), then "
              f"{n - 1} decode steps of one token each ({decode_ms:.0f} ms median, timed once each)."]
    if shown["in-order"]:
        answer.append(f"Each decode step began only after the previous token was chosen ({n - 1} of {n - 1} steps). "
                      "That token is its input.")
    else:
        answer.append("This run's order check did not show every step waiting for the token before it. The claims "
                      "above say why.")
    if shown["next-changes"]:
        answer.append(f"Change that input and the output changes. With token {k} forced to "
                      f"{tok.decode([alternative])!r}, {effect}.")
    else:
        answer.append(f"Forcing token {k} to {tok.decode([alternative])!r} did not change the next token in this "
                      "run. Try another --prompt or more --tokens.")
    answer.append(f"So output length sets the number of steps. {args.tokens} tokens cost up to {args.tokens} "
                  "passes, one after another. Only the prompt's tokens, already known, go through in parallel.")
    if shown["same-probabilities"] and shown["one-pass-faster"]:
        answer.append(f"A known answer can be checked in parallel too. Here one pass gave the loop's probabilities "
                      f"(within {diff:.0e}) in {t_pass.min * 1e3:.0f} ms against {t_loop.min * 1e3:.0f} ms for the "
                      f"loop's {n} passes. Each time is the fastest of {args.repeats}, and the two ranges do not "
                      "overlap.")
    elif shown["same-probabilities"]:
        answer.append(f"One pass over a known answer gave the loop's probabilities (within {diff:.0e}). This run "
                      f"could not show whether it is faster: {t_pass.min * 1e3:.0f} vs {t_loop.min * 1e3:.0f} ms at "
                      "their fastest. The claims above say why. Run it again on a quiet machine.")
    else:
        answer.append("This run could not show that one pass gives the loop's probabilities. The claims above say "
                      "why.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

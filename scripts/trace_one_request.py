"""Which functions of the package run for one greedy request, and how many lines of source they span.

    python scripts/trace_one_request.py                    # the default model, "The capital of France is", 8 tokens
    python scripts/trace_one_request.py --model PATH --json

The model is loaded first, untraced (loading is not the request); then `generate` runs under sys.setprofile, and
every function of minitransformer/ that is called is noted once. Its size is its whole definition, docstring and
comments included (inspect.getsourcelines), as a reader meets it. The table lists the files in the order the request
first enters them: that is the path docs/code_tour.md walks. What this counts is what a learner must read to follow
one token from the prompt's text to the streamed text; tests/test_code_tour.py keeps it under its budget.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from minitransformer import SamplingParams, generate, load_model

PACKAGE = ROOT / "minitransformer"


def trace(run) -> dict[str, dict[str, int]]:
    """{file (relative to minitransformer/): {qualified function name: lines}} of the package's functions that
    run(), in the order first called."""
    seen: dict[str, dict[str, int]] = {}
    codes: set = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in codes:
            return
        codes.add(code)
        path = Path(code.co_filename)
        if PACKAGE not in path.parents or code.co_name in ("<module>", "<lambda>", "<genexpr>", "<listcomp>",
                                                           "<dictcomp>", "<setcomp>"):
            return
        try:
            lines, _ = inspect.getsourcelines(code)
        except OSError:
            return
        seen.setdefault(str(path.relative_to(PACKAGE)), {})[code.co_qualname] = len(lines)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a GGUF path or known name (default: the default model)")
    parser.add_argument("--prompt", default="The capital of France is")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--json", action="store_true", help="print {file: {function: lines}} as JSON")
    args = parser.parse_args(argv)
    model = load_model(args.model)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0)
    generate(model, args.prompt, params)                          # first-call imports happen outside the trace
    seen = trace(lambda: generate(model, args.prompt, params))
    if args.json:
        print(json.dumps(seen, indent=1))
        return 0
    total = 0
    for file, functions in seen.items():
        lines = sum(functions.values())
        total += lines
        print(f"{file:32} {lines:5d} lines in {len(functions):3d} functions")
    print(f"{'total':32} {total:5d} lines in {sum(len(f) for f in seen.values()):3d} functions, {len(seen)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Options that generate and chat share: which model and how to run it, and the SamplingParams fields as flags.

Kept apart so both subcommands spell, check and load them the same way.
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from .. import ATTENTION
from ..core.backend import DEVICES
from ..core.errors import InputError
from ..core.kv_storage import CODECS, STORAGES
from ..core.sampling_params import Option, SamplingParams, options_of, sampling_options
from ..quantize.schemes import SCHEMES
from ..structured import ConstraintLimits, StructuredOutputsParams

MODEL_HELP = ("path of a llama-architecture GGUF, or a model fetched by name: smollm2-135m (the default, "
              "SmolLM2-135M-Instruct) or gemma3-270m")


def add_model_options(parser) -> None:
    parser.add_argument("--model", metavar="PATH|NAME", help=MODEL_HELP)
    parser.add_argument("--device", choices=DEVICES, default="cpu",
                        help="cpu (NumPy, the default) or gpu (CuPy on an NVIDIA GPU: the 'gpu' extra)")
    parser.add_argument("--attention", choices=ATTENTION, default="auto",
                        help="attention through layers.attention (arrays) or our CUDA kernels (kernels: on the CPU "
                             "they run on the slow CPU runner); auto: kernels on the GPU, arrays on the CPU")
    parser.add_argument("--weights", choices=SCHEMES, default="f32",
                        help="weights as float32 (default), int8 per channel or int4 in groups of 32 (lesson 13), "
                             "or f16: float16 storage, float32 accumulation (on the CPU slower than f32, since NumPy "
                             "has no half GEMM: it is there to check the GPU's arithmetic anywhere)")
    parser.add_argument("--kv-cache", choices=STORAGES, default="f32",
                        help="keys and values stored as " + "; ".join(f"{codec.name}: {codec.help}"
                                                                       for codec in CODECS.values()))


def load_model_from_args(args, comm=None):
    """The model as the options ask: loaded once as float32, then quantized when --weights says so (f16 is
    load_model's dtype="float16"; the dequantize-GEMV kernel is int8 / int4 only). comm: a tensor-parallel rank's
    communicator (only its shard is loaded)."""
    from .. import load_model

    dtype = "float16" if args.weights == "f16" else "float32"
    model = load_model(args.model, device=args.device, attention=args.attention, dtype=dtype, comm=comm)
    if args.weights in ("int8", "int4"):
        from ..quantize import quantize_model
        model = quantize_model(model, args.weights, use_kernel=args.device == "gpu")
    return model


def check_speculative_flags(name: str | None, draft_model: str | None, n_layers: int | None = None) -> None:
    """`--speculative` and `--draft-model` checked as typed, before any model is loaded (n_layers: the loaded
    model's, to bound self:L). The library parses and checks the name (speculative.parse_method, check_layers);
    this layer names the flags."""
    from ..speculative import check_layers, parse_method

    if name is not None:
        try:
            parsed = parse_method(name)
            if parsed is None:
                raise InputError(f"--speculative must be ngram, self:L (L = layers that draft) or model, got {name!r}")
            if parsed[0] == "self":
                check_layers(parsed[1], n_layers)
        except InputError as exc:
            message = str(exc)
            raise InputError(message if message.startswith("--") else "--" + message) from None
    if name != "model" and draft_model:
        raise InputError("--draft-model is used only with --speculative model")
    if name == "model" and not draft_model:
        raise InputError("--speculative model needs --draft-model PATH (a GGUF with the same vocabulary)")


def speculative_from_cli(name: str | None, draft_model: str | None, device: str = "cpu",
                         n_layers: int | None = None):
    """`--speculative ngram|self:L|model` and `--draft-model PATH` -> what speculative_runner(...) takes (a loaded
    draft model for "model")."""
    from .. import load_model

    check_speculative_flags(name, draft_model, n_layers)
    if name != "model":
        return name
    return load_model(draft_model, device=device)


def add_sampling_options(parser, max_tokens: int) -> None:
    """One flag per SamplingParams field, named as vLLM names it and described by the field's own metadata
    (sampling_params.sampling_options); the ranges are checked by SamplingParams. max_tokens: this subcommand's
    default."""
    add_options(parser, sampling_options(), {"max_tokens": max_tokens})


def add_options(parser, options: list[Option], defaults: dict | None = None) -> None:
    """One flag per Option (core.sampling_params.options_of: SamplingParams', serving's EngineArgs'): its name,
    help, metavar and choices from the field's metadata, the type from its annotation. defaults: this subcommand's
    own defaults by field name. A bool that defaults to on (or to "decide for me", None) gets --x / --no-x."""
    for option in options:
        default = (defaults or {}).get(option.name, option.default)
        help = option.help.format(default=default)
        if option.kind is bool and default is False:
            parser.add_argument(option.flag, dest=option.name, action="store_true", help=help)
        elif option.kind is bool:
            parser.add_argument(option.flag, dest=option.name, action=argparse.BooleanOptionalAction,
                                default=default, help=help)
        elif option.repeated:
            parser.add_argument(option.flag, dest=option.name, action="append", type=option.kind, default=[],
                                metavar=option.metavar, help=help)
        else:
            parser.add_argument(option.flag, dest=option.name, type=option.kind, default=default,
                                metavar=option.metavar, choices=option.choices, help=help)


def checked(build, options: list[Option]):
    """build() (a SamplingParams or EngineArgs from the parsed flags), its InputError naming each field as the flag
    it was typed as (--top-p, not top_p)."""
    try:
        return build()
    except InputError as exc:
        message = str(exc)
        for option in options:
            message = re.sub(rf"(?<![-\w]){option.name}(?!\w)", option.flag, message)
        raise InputError(message) from None


def add_structured_options(parser) -> None:
    """--json-schema / --regex / --choice / --grammar / --json-object: the output must match one of them (the
    sampler masks every token that would break it; structured/). argparse refuses two at once."""
    group = parser.add_argument_group("structured output (at most one; the sampler masks every token that would "
                                      "break it)").add_mutually_exclusive_group()
    group.add_argument("--json-schema", metavar="FILE",
                       help="the output is JSON that validates against the JSON schema in FILE (- reads stdin)")
    group.add_argument("--regex", metavar="R", help="the whole output matches the regular expression R")
    group.add_argument("--choice", metavar="A,B,C", action="append",
                       help="the output is exactly one of these strings; repeat --choice to give strings that "
                            "contain commas (then each value is one choice)")
    group.add_argument("--grammar", metavar="FILE",
                       help="the output follows the Lark or GBNF grammar in FILE (- reads stdin)")
    group.add_argument("--json-object", action="store_true", help="the output is a JSON object (any keys)")
    add_constraint_limit_options(parser)


def add_constraint_limit_options(parser) -> None:
    """--structured-max-chars, --structured-max-rules, ...: what one constraint may cost (ConstraintLimits)."""
    add_options(parser.add_argument_group("structured output: what one constraint may cost (structured/limits.py's "
                                          "ConstraintLimits)"), options_of(ConstraintLimits))


def constraint_limits(args) -> ConstraintLimits:
    """The ConstraintLimits the --structured-* options describe, checked (an error names the flag)."""
    options = options_of(ConstraintLimits)
    return checked(lambda: ConstraintLimits(**{o.name: getattr(args, o.name) for o in options}), options)


def structured_from_args(args) -> StructuredOutputsParams | None:
    """The constraint the options ask for, read and compiled before the model loads: a file that cannot be read or
    a bad schema, regex or grammar is one InputError naming the option (exit 2)."""
    value: Any
    if getattr(args, "json_schema", None) is not None:
        flag, kind, value = "--json-schema", "json", _read_text(args.json_schema, "--json-schema")
    elif getattr(args, "regex", None) is not None:
        flag, kind, value = "--regex", "regex", args.regex
    elif getattr(args, "choice", None):
        flag, kind, value = "--choice", "choice", _choices(args.choice)
    elif getattr(args, "grammar", None) is not None:
        flag, kind, value = "--grammar", "grammar", _read_text(args.grammar, "--grammar")
    elif getattr(args, "json_object", False):
        flag, kind, value = "--json-object", "json_object", True
    else:
        return None
    limits = constraint_limits(args)
    try:
        return StructuredOutputsParams.of({kind: value}, limits)
    except InputError as exc:
        raise InputError(f"{flag}: {exc}") from None


def _choices(values: list[str]) -> list[str]:
    """One --choice is a comma-separated list; several are one choice each, commas included."""
    return values[0].split(",") if len(values) == 1 else values


def _read_text(path: str, flag: str) -> str:
    """A file's text, or standard input's for "-"."""
    if path == "-":
        return sys.stdin.read()
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{flag}: cannot read {path}: {exc.strerror if isinstance(exc, OSError) else exc}") \
            from None


def sampling_params(args):
    """SamplingParams from the parsed options: every range is checked there, before the model is loaded, and an
    error names the option as it was typed (--top-p, not top_p). The structured-output options, where the parser
    has them, are read and compiled here too."""
    options = sampling_options()
    structured = structured_from_args(args)
    values: dict[str, Any] = {o.name: tuple(getattr(args, o.name)) if o.repeated else getattr(args, o.name)
                              for o in options}
    return checked(lambda: SamplingParams(**values, structured=structured), options)

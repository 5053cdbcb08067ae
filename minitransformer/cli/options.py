"""Options that generate and chat share: which model and how to run it, and the SamplingParams fields as flags.

Kept apart so both subcommands spell, check and load them the same way.
"""

from __future__ import annotations

import dataclasses
import re

from ..errors import InputError


def add_model_options(parser) -> None:
    parser.add_argument("--model", metavar="PATH",
                        help="path of a llama-architecture GGUF (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="cpu (NumPy, the default) or gpu (CuPy on an NVIDIA GPU: the 'gpu' extra)")
    parser.add_argument("--attention", choices=("auto", "arrays", "kernels"), default="auto",
                        help="attention through layers.attention (arrays) or our CUDA kernels (kernels: on the CPU "
                             "they run on the slow CPU runner); auto: kernels on the GPU, arrays on the CPU")
    parser.add_argument("--weights", choices=("f32", "int8", "int4", "f16"), default="f32",
                        help="weights as float32 (default), int8 per channel or int4 in groups of 32 (lesson 13), "
                             "or f16: float16 storage, float32 accumulation (on the CPU slower than f32, since NumPy "
                             "has no half GEMM: it is there to check the GPU's arithmetic anywhere)")
    parser.add_argument("--kv-cache", choices=("f32", "int8"), default="f32",
                        help="keys and values stored as float32 (default) or int8 with a scale per token and head")


def load_model_from_args(args):
    """The model as the options ask: loaded once as float32, then quantized when --weights says so (f16 is
    load_model's dtype="float16"; the dequantize-GEMV kernel is int8 / int4 only)."""
    from ..loading import load_model

    dtype = "float16" if args.weights == "f16" else "float32"
    model = load_model(args.model, device=args.device, attention=args.attention, dtype=dtype)
    if args.weights in ("int8", "int4"):
        from ..quantize import quantize_model
        model = quantize_model(model, args.weights, use_kernel=args.device == "gpu")
    return model


def speculative_from_cli(name: str | None, draft_model: str | None, device: str = "cpu",
                         n_layers: int | None = None):
    """`--speculative ngram|self:L|model` and `--draft-model PATH` -> what generate(speculative=...) takes (a loaded
    draft model for "model")."""
    from ..loading import load_model
    from ..speculative import check_cli

    check_cli(name, draft_model, n_layers)
    if name != "model":
        return name
    return load_model(draft_model, device=device)


def add_sampling_options(parser, max_tokens: int) -> None:
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
    from ..sampling import SamplingParams

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

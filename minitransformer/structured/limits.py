"""What one request's constraint may cost, checked before it reaches the compiler, and the compiler's own budgets.

A constraint is the client's program: a 21-character regex can ask the compiler to build a million expressions, a
70 KB grammar of chained rules can recurse past the stack of the thread that compiles it (a crash, not an error), a
schema whose language is empty can make every mask allow nothing. So each request's constraint is held to limits,
each refusal one InputError naming the limit (a 400 on the server, exit 2 on the CLI), before any model work:

    the source           at most max_chars characters, valid Unicode; choice lists at most max_choices strings
    its shape            JSON nested at most max_json_depth levels, at most max_ref_depth through its $refs;
                         grammars of at most max_rules rules (counted here, in Python, before llguidance sees them)
    the grammar          at most max_grammar_size symbols (llguidance's LLParserLimits, with the parser's and the
                         lexer's budgets of work per mask: step_max_items, step_lexer_fuel, initial_lexer_fuel)
    what it dictates     at most max_forced_bytes bytes before the model chooses anything
    compiling            on a thread with a stack of COMPILE_STACK_BYTES (llguidance's compiler recurses a few KB per
                         nested rule; an 8 MiB stack crashes the process at about 2,500), for at most
                         compile_timeout_s seconds
    every mask           mask_budget_s seconds of CPU time per token on average (with a grace of a few masks'
                         worth): a request whose masks cost more is ended (finish_reason "abort", stop_reason
                         "constraint"), so each constrained neighbour adds at most that much to a step of its batch

The limits are `ConstraintLimits`; `minitransformer serve` raises them with its --structured-* options, Python with
StructuredOutputsParams(..., limits=ConstraintLimits(...)). The figures that set the defaults were measured with
llguidance 1.9 on SmolLM2's vocabulary: real schemas (OpenAI allows 100 properties, 5 levels) use a few hundred
grammar symbols and masks of a few milliseconds.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field, fields

import llguidance

from ..core.backend import check_count
from ..core.errors import InputError
from ..core.sampling_params import option

COMPILE_STACK_BYTES = 256 * 2**20     # virtual: only the pages a deep compile touches are ever backed by memory


@dataclass(frozen=True)
class ConstraintLimits:
    """The budgets of one request's constraint (see the module docstring)."""
    max_chars: int = field(default=100_000, metadata=option(
        "a constraint's source (schema, regex, grammar, choices) has at most N characters (default {default})", "N",
        flag="structured-max-chars"))
    max_choices: int = 1024
    max_json_depth: int = 64           # llguidance refuses 128 anyway, with a less helpful message
    max_ref_depth: int = 1000          # levels of a JSON schema counted through its $refs
    max_rules: int = field(default=1000, metadata=option(
        "a Lark or GBNF grammar has at most N rules (default {default})", "N", flag="structured-max-rules"))
    max_grammar_size: int = field(default=4096, metadata=option(
        "a compiled constraint has at most N grammar symbols (default {default}; a JSON object takes about 8 per "
        "optional property)", "N", flag="structured-max-symbols"))
    max_forced_bytes: int = 4096       # bytes the constraint dictates before the model chooses one
    step_max_items: int = 5000         # parser items per mask (llguidance's default is 50,000)
    step_lexer_fuel: int = 200_000     # lexer work per mask
    initial_lexer_fuel: int = 200_000  # building the lexer and the first run of dictated bytes
    max_lexer_states: int = 50_000
    compile_timeout_s: float = field(default=10.0, metadata=option(
        "compiling a constraint takes at most S seconds (default {default})", "S",
        flag="structured-compile-timeout"))
    mask_budget_s: float = field(default=0.025, metadata=option(
        "a constraint's masks take at most S seconds of CPU time per token on average, or its request ends "
        "(default {default})", "S", flag="structured-mask-budget"))

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                check_count(f.name, value)
            elif not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")):
                raise InputError(f"{f.name} must be a positive number of seconds, got {value!r}")

    def parser(self) -> llguidance.LLParserLimits:
        """llguidance's own limits from these (its parser row holds one item per symbol of a flat rule)."""
        return llguidance.LLParserLimits(
            max_items_in_row=self.max_grammar_size, max_grammar_size=self.max_grammar_size,
            initial_lexer_fuel=self.initial_lexer_fuel, step_lexer_fuel=self.step_lexer_fuel,
            step_max_items=self.step_max_items, max_lexer_states=self.max_lexer_states, verbose_errors=False)


DEFAULT_LIMITS = ConstraintLimits()


# ---------------------------------------------------------------------------------------------------- the source

def check_text(what: str, text: str, limits: ConstraintLimits) -> None:
    """Size and Unicode: a lone surrogate (undecodable bytes from a command line, "\\ud800" in JSON) is text no
    output can contain, and the compiler cannot encode it."""
    if len(text) > limits.max_chars:
        raise InputError(f"{what} has {len(text):,} characters; at most {limits.max_chars:,} are allowed "
                         "(it is compiled before the request starts)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} holds {text[exc.start]!r} at character {exc.start}, which is not valid Unicode "
                         "(a lone surrogate)") from None


def json_depth(value) -> int:
    """How deeply dicts and lists nest in a decoded JSON value, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def depth_through_refs(schema: dict) -> int:
    """The deepest nesting from the root when every local "$ref" also leads one level down into what it names: the
    depth llguidance's compiler recurses to. Without recursion, each node once; a $ref back into its own ancestors
    (a recursive schema) is not followed."""
    def target(ref):
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return None
        node: object = schema
        for part in ref[2:].split("/"):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, dict) else None
        return node if isinstance(node, (dict, list)) else None

    def children(node) -> list:
        found = list(node.values()) if isinstance(node, dict) else list(node)
        if isinstance(node, dict) and (named := target(node.get("$ref"))) is not None:
            found.append(named)
        return [c for c in found if isinstance(c, (dict, list))]

    depth: dict[int, int] = {}
    open_: set[int] = set()                                   # entered, not finished: the path from the root
    stack = [(schema, False)]
    while stack:
        node, finished = stack.pop()
        key = id(node)
        if finished:
            open_.discard(key)
            depth[key] = 1 + max((depth.get(id(c), 0) for c in children(node)), default=0)
        elif key not in depth and key not in open_:
            open_.add(key)
            stack.append((node, True))
            stack.extend((c, False) for c in children(node) if id(c) not in depth and id(c) not in open_)
    return depth[id(schema)]


def check_schema(schema, limits: ConstraintLimits) -> str:
    """A decoded JSON schema's nesting checked, then its JSON text (what the compiler is given: a deeply nested
    dict handed to it directly crashed it)."""
    depth = json_depth(schema)
    if depth > limits.max_json_depth:
        raise InputError(f"the JSON schema nests {depth:,} levels deep; at most {limits.max_json_depth} are allowed")
    if isinstance(schema, dict) and (through := depth_through_refs(schema)) > limits.max_ref_depth:
        raise InputError(f"the JSON schema nests {through:,} levels deep through its $refs; at most "
                         f"{limits.max_ref_depth:,} are allowed")
    text = json.dumps(schema, ensure_ascii=False)
    check_text("the JSON schema", text, limits)
    return text


RULE = re.compile(r"^[ \t]*[?!]?@?[A-Za-z_][\w.-]*(?:\[[^\]\n]*\])?[ \t]*(?::|::=)", re.M)   # name: / name ::=


def check_rules(grammar: str, limits: ConstraintLimits) -> None:
    """The rules of a Lark or GBNF grammar, counted from its text before it is parsed (GBNF's conversion to Lark
    takes seconds for thousands of rules, and a long chain of them recurses past a thread's stack)."""
    rules = len(RULE.findall(grammar))
    if rules > limits.max_rules:
        raise InputError(f"the grammar has {rules:,} rules; at most {limits.max_rules:,} are allowed")


def one_line(message: str) -> str:
    """llguidance's error message on one line, without its "<non-verbose/>" marker (we ask for short messages)."""
    return " ".join(message.replace("<non-verbose/>", "").split())


# ---------------------------------------------------------------------------------------------------- compiling

_stack_size = threading.Lock()       # threading.stack_size() is process-wide: set it, start the thread, restore it


def on_big_stack(work, timeout_s: float, what: str):
    """work() on a thread of its own with a COMPILE_STACK_BYTES stack; its result, or the InputError it raised, or
    one saying it did not finish within timeout_s. A thread stuck in native code cannot be stopped: it goes on, bound
    by the compiler's fuel, and its result is dropped."""
    box: dict = {}

    def run():
        try:
            box["value"] = work()
        except BaseException as exc:                  # handed to the caller's thread
            box["error"] = exc

    with _stack_size:
        previous = threading.stack_size(COMPILE_STACK_BYTES)
        try:
            thread = threading.Thread(target=run, name="constraint-compile", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join(timeout_s)
    if thread.is_alive():
        raise InputError(f"compiling {what} took longer than {timeout_s:g} s; at most {timeout_s:g} s are allowed")
    if "error" in box:
        raise box["error"]
    return box["value"]

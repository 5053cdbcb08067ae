"""A client's constraint held to limits (structured/limits.py): what used to disable or crash the server, refused
before any model work; a constraint that fails while its request runs ends that request only.

    refused when made       each hostile constraint found by probing the server (a regex that asks for a million
                            expressions, grammars and $ref chains deep enough to crash the compiler's thread, a
                            schema nested 600 deep, a lone surrogate, languages no output can satisfy) is one
                            InputError naming the limit; the CLI exits 2 with that line, the crashing ones included
    compiled once           a source compiled (or refused) once is not compiled again
    failing mid-request     a matcher that fails inside a batch of 8 ends its own request (finish_reason "abort",
                            stop_reason "constraint", the error named, its blocks freed); the 7 others give the
                            tokens they give alone. A real parser limit reached mid-output does the same.
    the mask budget         a constraint whose masks cost more than the budget is ended within a few tokens

The server's side (400s, streams, the server alive after each) is tests/test_server_constraints.py. Runs on the tiny
GGUF model, whose vocabulary holds the 256 byte tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from minitransformer import InputError, SamplingParams, generate
from minitransformer.serving import Engine
from minitransformer.structured import (
    DEFAULT_LIMITS,
    Constraint,
    ConstraintLimits,
    StructuredOutputsParams,
    params as params_module,
)

NESTED = "((a{100}){100}){100}"               # 21 characters that asked llguidance for a million expressions


def lark_alternatives(n: int) -> str:
    return "start: " + " | ".join(f'"option_num_{i:05d}"' for i in range(n))


def lark_chain(n: int) -> str:
    """n rules each naming the next: the compiler recurses once per rule (6,000 crashed it)."""
    return "start: r0\n" + "".join(f"r{i}: r{i + 1}\n" for i in range(n)) + f'r{n}: "x"\n'


def ref_chain(n: int) -> dict:
    definitions = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
    return {"$ref": "#/$defs/d0", "$defs": {**definitions, f"d{n}": {"type": "string"}}}


def ref_nested(n: int) -> dict:
    definitions = {f"d{i}": {"type": "object", "properties": {f"p{i}": {"$ref": f"#/$defs/d{i + 1}"}}}
                   for i in range(n)}
    return {"$ref": "#/$defs/d0", "$defs": {**definitions, f"d{n}": {"type": "string"}}}


def any_of(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"anyOf": [schema, {"type": "integer"}]}
    return schema


def optional_properties(n: int, pattern: str | None = None) -> dict:
    field = {"type": "string", **({"pattern": pattern} if pattern else {})}
    return {"type": "object", "properties": {f"field_{i:04d}": field for i in range(n)}}


# Each case the probe found, as the fields of StructuredOutputsParams, and the words of its refusal.
REFUSED = [
    ("nested regex", dict(regex=NESTED), "dictates 97,666 bytes or more before the model chooses anything; at most "
                                         "4,096 are allowed"),
    ("nested pattern", dict(json={"type": "string", "pattern": f"^{NESTED}$"}), "dictates 97,"),
    ("nested Lark terminal", dict(grammar=f"start: T\nT: /{NESTED}/\n"), "dictates 97,666 bytes"),
    ("a{65536}", dict(regex="a{65536}"), "the regex dictates"),
    ("((a{50}){50}){50}", dict(regex="((a{50}){50}){50}"), "the regex dictates"),
    ("1,500 patterned properties", dict(json=optional_properties(1500, "^[a-z0-9]{2,8}$")),
     "grammar size (number of symbols) too big (limit for this grammar: 4096)"),
    ("6,000 chained rules", dict(grammar=lark_chain(6000)), "the grammar has 6,002 rules; at most 1,000 are allowed"),
    ("$ref chain of 2,900", dict(json=ref_chain(2900)),
     "the JSON schema nests 2,903 levels deep through its $refs; at most 1,000 are allowed"),
    ("1,200 properties nested through $ref", dict(json=ref_nested(1200)), "levels deep through its $refs"),
    ("anyOf 600 deep", dict(json=any_of(600)), "the JSON schema nests 1,201 levels deep; at most 64 are allowed"),
    ("lone surrogate", dict(regex="\ud800"), "holds '\\ud800' at character 0, which is not valid Unicode"),
    ("empty class", dict(regex=r"[^\s\S]"), "no output can satisfy the regex: it matches no string"),
    ("empty Lark terminal", dict(grammar="start: T\nT: /[^\\s\\S]/\n"), "no output can satisfy the grammar"),
    ("start: start", dict(grammar="start: start\n"), "no output can satisfy the grammar"),
    ("GBNF root ::= root", dict(grammar="root ::= root\n"), "no output can satisfy the grammar"),
    ("$ref cycle", dict(json={"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}),
     "no output can satisfy the JSON schema"),
    ("too long", dict(grammar='start: "' + "w" * DEFAULT_LIMITS.max_chars + '"\n'),
     f"at most {DEFAULT_LIMITS.max_chars:,} are allowed"),
]


@pytest.mark.parametrize("fields, words", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_each_hostile_constraint_is_refused_when_made_naming_the_limit(fields, words):
    with pytest.raises(InputError) as refused:
        StructuredOutputsParams(**fields)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_the_limits_are_named_options_and_a_raised_limit_admits_more():
    """What --structured-max-rules raises: the same grammar refused at the default is compiled with room."""
    grammar = lark_chain(1500)
    with pytest.raises(InputError, match="at most 1,000 are allowed"):
        StructuredOutputsParams(grammar=grammar)
    StructuredOutputsParams(grammar=grammar, limits=ConstraintLimits(max_rules=2000))
    with pytest.raises(InputError, match="max_rules must be"):
        ConstraintLimits(max_rules=0)
    with pytest.raises(InputError, match="mask_budget_s must be a positive number of seconds"):
        ConstraintLimits(mask_budget_s=float("nan"))


def test_a_source_is_compiled_once_and_a_refusal_is_remembered(monkeypatch):
    calls = []
    probe = params_module.probe
    monkeypatch.setattr(params_module, "probe", lambda *a: calls.append(a[0]) or probe(*a))
    schema = {"type": "object", "properties": {"cached_once": {"type": "integer"}}}
    first, second = StructuredOutputsParams(json=schema), StructuredOutputsParams(json=json.dumps(schema))
    assert first.compiled == second.compiled and calls == ["json"]
    for _ in range(2):
        with pytest.raises(InputError, match="no output can satisfy"):
            StructuredOutputsParams(regex="[^\\s\\S]|[^\\w\\W]")
    assert calls == ["json", "regex"]


# ---------------------------------------------------------------------------------------------------- at run time

class FailingMatcher:
    """llguidance's matcher, failing (raising) when it computes its `fail_at`-th mask: a planted matcher failure."""

    def __init__(self, matcher, fail_at: int):
        self.matcher, self.fail_at, self.masks = matcher, fail_at, 0

    def unsafe_compute_mask_ptr(self, *args):
        self.masks += 1
        if self.masks == self.fail_at:
            raise RuntimeError("planted failure")
        return self.matcher.unsafe_compute_mask_ptr(*args)

    def __getattr__(self, name):
        return getattr(self.matcher, name)


class Planted:
    """A TokenMaskSpec whose requests' matchers fail at their third mask."""
    kind = "regex"

    def __init__(self, spec: StructuredOutputsParams):
        self.spec = spec

    def make_mask(self, tokenizer) -> Constraint:
        constraint = Constraint(self.spec, tokenizer)
        constraint.matcher = FailingMatcher(constraint.matcher, fail_at=3)
        return constraint


LETTERS = StructuredOutputsParams(regex="[a-z ]{1,60}")
BATCH = [("the cat", dict(ignore_eos=True)), ("a b c", dict(ignore_eos=True)), ("hello", dict(ignore_eos=True)),
         ("x", dict(structured=LETTERS)), ("in the", dict(structured=StructuredOutputsParams(choice=["yes", "no"]))),
         ("one two", dict(ignore_eos=True)), ("zz", dict(structured=StructuredOutputsParams(regex="[0-9]{4}")))]


def test_a_matcher_failing_inside_a_batch_of_8_ends_its_request_only(tiny_model):
    engine = Engine(tiny_model, max_num_seqs=8, num_blocks=64, block_size=4)
    victim = engine.add_request("the", SamplingParams(max_tokens=12, temperature=0.0, structured=Planted(LETTERS)))
    others = {engine.add_request(prompt, SamplingParams(max_tokens=12, temperature=0.0, **fields)): (prompt, fields)
              for prompt, fields in BATCH}
    results = engine.run()
    failed = results[victim]
    assert (failed.finish_reason, failed.stop_reason) == ("abort", "constraint")
    assert "matcher failed at output token 3: RuntimeError: planted failure" in failed.structured["error"]
    alone = generate(tiny_model, "the", SamplingParams(max_tokens=12, temperature=0.0, structured=LETTERS))
    assert failed.token_ids[:2] == alone.token_ids[:2] and failed.token_ids[2] == tiny_model.tokenizer.eos_id
    for rid, (prompt, fields) in others.items():
        solo = generate(tiny_model, prompt, SamplingParams(max_tokens=12, temperature=0.0, **fields))
        assert results[rid].token_ids == solo.token_ids, prompt
        assert (results[rid].finish_reason, results[rid].stop_reason) == (solo.finish_reason, solo.stop_reason)
    assert engine.block_manager.num_free_blocks == 64 and not engine.has_unfinished_requests()
    assert engine.stats.num_masks == sum(r.structured["masks"] for r in results.values() if r.structured)


def test_a_parser_limit_reached_mid_output_ends_the_request_with_its_reason(tiny_model):
    """A real one: this regex compiles, but its lexer runs out of expressions after a few x's (llguidance's "too
    many expressions constructed", which used to be an exception in the engine's step)."""
    params = SamplingParams(max_tokens=60, temperature=0.0,
                            structured=StructuredOutputsParams(regex="((x{1,30}){1,30}){1,30}"))
    result = generate(tiny_model, "x", params)
    assert (result.finish_reason, result.stop_reason) == ("abort", "constraint")
    assert "reached a limit of its parser" in result.structured["error"]
    assert "too many expressions constructed" in result.structured["error"]
    assert set(result.text) == {"x"} and result.structured["complete"] is False


def test_a_constraint_over_its_mask_budget_is_ended_within_the_grace(tiny_model):
    tight = StructuredOutputsParams(regex="[a-z ]{1,60}", limits=ConstraintLimits(mask_budget_s=1e-7))
    result = generate(tiny_model, "the", SamplingParams(max_tokens=30, temperature=0.0, structured=tight))
    assert (result.finish_reason, result.stop_reason) == ("abort", "constraint")
    assert "ms per token over 1 tokens; at most 0.0001 ms per token are allowed" in result.structured["error"]
    assert result.token_ids == [tiny_model.tokenizer.eos_id]
    roomy = generate(tiny_model, "the", SamplingParams(max_tokens=30, temperature=0.0, structured=LETTERS))
    assert roomy.stop_reason != "constraint" and roomy.structured["error"] is None


def test_the_budget_reads_cpu_time_so_a_busy_machine_ends_nothing(tiny_model):
    """Masks are timed on the engine thread's CPU clock: time the thread spends waiting (another process on the
    core, the GIL) is not the constraint's cost."""
    constraint = Constraint(LETTERS, tiny_model.tokenizer)
    V = tiny_model.config.vocab_size
    for _ in range(10):
        mask = constraint.allowed(V)
        constraint.accept(int(np.flatnonzero(mask)[1]))
    assert constraint.error is None and 0 < constraint.budgeted_cpu_s <= constraint.mask_s + 1e-3


# ---------------------------------------------------------------------------------------------------- the CLI

def cli(*args: str | bytes) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minitransformer", *args], capture_output=True, timeout=300)


def one_line_exit_2(result: subprocess.CompletedProcess, *words: str) -> None:
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2, (result.returncode, stderr)
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    for word in words:
        assert word in stderr, stderr


@pytest.mark.parametrize("make_args, words", [
    (lambda tmp: ["--grammar", str(write(tmp / "chain.lark", lark_chain(6000)))], ["6,002 rules"]),
    (lambda tmp: ["--regex", NESTED], ["dictates 97,666 bytes"]),
    (lambda tmp: ["--json-schema", str(write(tmp / "refs.json", json.dumps(ref_chain(2900), separators=(",", ":"))))],
     ["2,903 levels deep through its $refs"]),
    (lambda tmp: ["--regex", b"ab\xff"], ["not valid Unicode"]),
    (lambda tmp: ["--grammar", str(write(tmp / "loop.gbnf", "root ::= root\n"))], ["no output can satisfy"]),
    (lambda tmp: ["--regex", "a+", "--structured-max-chars", "0"],
     ["--structured-max-chars must be a positive integer, got 0"]),
], ids=["grammar chain (was SIGSEGV)", "nested regex (was a traceback)", "$ref chain", "undecodable bytes",
        "empty GBNF", "a bad limit"])
def test_the_cli_refuses_what_crashed_it_with_one_line_and_exit_2(tiny_model_path, tmp_path, make_args, words):
    one_line_exit_2(cli("generate", "hi", "--model", str(tiny_model_path), *make_args(tmp_path)), *words)


def write(path, text: str):
    path.write_text(text)
    return path

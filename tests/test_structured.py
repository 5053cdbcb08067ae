"""Structured output: a constraint is one InputError when it is wrong, a mask in the sampling stage when it is right,
and every output it produces parses -- through generate(), stream(), the engine (mixed batches, preemption) and
speculative decoding (greedy output unchanged, drafts inside the constraint).

References: json.loads + jsonschema.validate, re.fullmatch and the choice list for the real model's outputs; the
same request run alone through generate() for the engine; plain constrained greedy for speculative decoding; the
raw logits and the matcher itself for the mask step. The unit tests run on the tiny GGUF model, whose vocabulary
holds the 256 byte tokens (llguidance can spell any text with them); the real model's tests are marked real_model.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import jsonschema
import numpy as np
import pytest

from minitransformer import InputError, SamplingParams, generate, stream
from minitransformer.core.sampling import SamplingRow, mask_tokens, next_tokens
from minitransformer.core.stopping import check_stop
from minitransformer.serving import Engine, SequenceStatus
from minitransformer.speculative import NgramDrafter, SpeculativeConfig, speculative_runner
from minitransformer.speculative.drafters import SecondModelDrafter
from minitransformer.structured import MAX_CONSTRAINT_CHARS, Constraint, StructuredOutputsParams
from structured_cases import CHOICES, REGEXES, SCHEMAS
from tiny_model import write_tiny_llama

# The tiny model's random weights make its distributions nearly one-hot; seeded rows sample hot so that a request
# drawing from the wrong generator would show (as in test_serving_engine.py).
HOT = 5.0
FIVE_DIGITS = StructuredOutputsParams(regex="[0-9]{5}")
SMALL_OBJECT = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                                 "b": {"enum": ["x", "y"]}},
                "required": ["a", "b"], "additionalProperties": False}


# ---------------------------------------------------------------------------------------------------- checking

@pytest.mark.parametrize("structured, message", [
    (dict(json={"type": "nonsense"}), "invalid JSON schema: Invalid type: nonsense"),
    (dict(json="{not json"), "the JSON schema is not valid JSON"),
    (dict(json={"type": "object", "properties": {"a": {"minimum": "x"}}}), "invalid JSON schema: .*minimum"),
    (dict(json=False), "the JSON schema is false"),
    (dict(json=[1, 2]), "a JSON schema must be an object"),
    (dict(regex="(ab"), "invalid regex: .*unclosed group"),
    (dict(regex=""), "regex must be a non-empty string"),
    (dict(grammar="start: ("), "invalid grammar: .*Expected token"),
    (dict(grammar='root ::= "a" undefined'), "invalid grammar: .*'undefined' not found"),
    (dict(choice=[]), "choice must be a non-empty list"),
    (dict(choice="yes"), "choice must be a non-empty list"),
    (dict(json={"type": "object"}, regex="a"), "exactly one of .*; got json, regex"),
    (dict(), "exactly one of .*; got none"),
    (dict(regex="a" * (MAX_CONSTRAINT_CHARS + 1)), f"the regex has {MAX_CONSTRAINT_CHARS + 1:,} characters"),
    (dict(json={"enum": ["x" * MAX_CONSTRAINT_CHARS]}), "the JSON schema has .* characters; at most"),
    (dict(choice=["a"] * 1025), "choice has 1025 strings"),
    (dict(jsn={}), "structured output has no field 'jsn'"),
])
def test_a_bad_constraint_is_one_input_error_naming_the_problem(structured, message):
    with pytest.raises(InputError, match=message):
        StructuredOutputsParams.of(structured)


def test_a_good_constraint_is_accepted_in_every_form():
    schema = SCHEMAS[0][1]
    of = StructuredOutputsParams.of
    assert SamplingParams(structured=of({"json": schema})).structured == StructuredOutputsParams(json=schema)
    assert of({"json": json.dumps(schema)}).kind == "json"
    assert of({"choice": ["a", "b"]}).choice == ("a", "b")
    assert of({"json_object": True}).kind == "json_object"
    assert of({"grammar": 'root ::= "a" | "b"'}).kind == "grammar"   # GBNF
    assert of({"grammar": 'start: "a" | "b"'}).kind == "grammar"     # Lark


def test_sampling_params_take_a_constraint_not_its_fields():
    """core's SamplingParams holds a TokenMaskSpec and compiles nothing itself; a dict of fields is refused with the
    one call that makes it a constraint."""
    with pytest.raises(InputError, match=r"StructuredOutputsParams.of\(fields\) takes a dict"):
        SamplingParams(structured={"json": SCHEMAS[0][1]})
    with pytest.raises(InputError, match="structured must describe a constraint"):
        SamplingParams(structured="[a-z]+")


# ---------------------------------------------------------------------------------------------------- the mask step

def test_the_mask_sets_refused_ids_to_minus_inf_and_leaves_the_raw_logits_for_logprobs(tiny_model):
    tokenizer, V = tiny_model.tokenizer, tiny_model.config.vocab_size
    digits = [tokenizer.encode(str(d))[0] for d in range(10)]
    logits = np.random.default_rng(0).normal(0, 2, (2, V)).astype(np.float32)                  # (2, V)
    raw = logits.copy()
    constraint = Constraint(FIVE_DIGITS, tokenizer)
    allowed = constraint.allowed(V)
    assert sorted(np.flatnonzero(allowed)) == sorted(digits)
    masked = mask_tokens(logits, [(), ()], [allowed, None])
    assert np.isneginf(masked[0, ~allowed]).all() and (masked[0, allowed] == raw[0, allowed]).all()
    assert (masked[1] == raw[1]).all()                           # an unconstrained neighbour is untouched
    assert (logits == raw).all()                                 # the caller's logits are never written
    rows = [SamplingRow(SamplingParams(temperature=0.0, logprobs=2), [5], [], constraint=constraint),
            SamplingRow(SamplingParams(temperature=0.0, logprobs=2), [5], [])]
    tokens, entries = next_tokens(logits, rows)
    assert tokens[0] == digits[int(np.argmax(raw[0, digits]))]   # the best digit, not the best token
    assert tokens[1] == int(np.argmax(raw[1]))
    log_softmax = raw[0] - np.log(np.exp(raw[0] - raw[0].max()).sum()) - raw[0].max()            # (V,) raw logits
    assert entries[0]["logprob"] == pytest.approx(float(log_softmax[tokens[0]]), abs=1e-5)
    assert [t[0] for t in entries[0]["top"]] == [int(i) for i in np.argsort(-raw[0])[:2]]     # raw, not masked


def test_the_constraint_wins_over_min_tokens_when_only_eos_may_follow(tiny_model):
    tokenizer, V = tiny_model.tokenizer, tiny_model.config.vocab_size
    eos = tokenizer.eos_id
    constraint = Constraint(StructuredOutputsParams(regex="[0-9]{1,3}"), tokenizer)
    for token in tokenizer.encode("123"):
        constraint.accept(token)
    allowed = constraint.allowed(V)
    assert np.flatnonzero(allowed).tolist() == [eos]             # three digits written: only EOS may follow
    logits = np.zeros((1, V), dtype=np.float32)
    assert np.isfinite(mask_tokens(logits, [(eos,)], [allowed])[0, eos])        # suppression gives way
    open_constraint = Constraint(StructuredOutputsParams(regex="[0-9]{1,3}"), tokenizer)
    open_constraint.accept(tokenizer.encode("1")[0])
    more = open_constraint.allowed(V)                            # EOS or more digits: min_tokens removes EOS
    assert more[eos] and np.isneginf(mask_tokens(logits, [(eos,)], [more])[0, eos])
    # end to end: min_tokens=10 cannot hold the request past a complete choice
    out = generate(tiny_model, "hi", SamplingParams(max_tokens=20, min_tokens=10, temperature=0.0,
                                                    structured=StructuredOutputsParams(choice=["ok"])))
    assert (out.text, out.finish_reason, out.stop_reason) == ("ok", "stop", "structured")


def test_a_matcher_in_an_error_state_ends_the_request_on_eos_and_says_so(tiny_model):
    """A parser limit hit mid-output puts llguidance's matcher in an error state for good, where it allows no
    token: the mask then forces EOS (the request ends cleanly instead of sampling from all -inf logits) and
    Result.structured reports the error and complete False."""
    tokenizer, V = tiny_model.tokenizer, tiny_model.config.vocab_size
    constraint = Constraint(FIVE_DIGITS, tokenizer)
    letter = tokenizer.encode("x")[0]
    assert not constraint.matcher.consume_token(letter)           # forced past the mask: the error state
    assert np.flatnonzero(constraint.allowed(V)).tolist() == [tokenizer.eos_id]
    constraint.accept(tokenizer.eos_id)                           # no second failure on the way out
    summary = constraint.summary()
    assert summary["complete"] is False and summary["error"]


def test_the_stop_rule_ends_a_complete_constraint_at_once():
    class Detok:
        text, last_token_bytes = "ab", 1
    params = SamplingParams(max_tokens=50, min_tokens=10)
    assert check_stop(params, Detok, [7, 8], 1, 0, 3, 100) is None                  # min_tokens holds it ...
    complete = SimpleNamespace(complete=True, error=None)                          # a TokenMask that is complete
    decision = check_stop(params, Detok, [7, 8], 1, 0, 3, 100, complete)
    assert (decision.finish_reason, decision.stop_reason) == ("stop", "structured")  # ... unless it is complete
    eos = check_stop(SamplingParams(max_tokens=50), Detok, [7, 0], 0, 0, 3, 100, complete)
    assert eos.stop_reason == "eos"                              # EOS taken at a complete match is still EOS
    length = check_stop(SamplingParams(max_tokens=2), Detok, [7, 8], 1, 0, 3, 100)
    assert (length.finish_reason, length.stop_reason) == ("length", None)


def test_generate_stops_when_the_constraint_completes_and_says_length_when_it_cannot(tiny_model):
    out = generate(tiny_model, "hi", SamplingParams(max_tokens=20, temperature=0.0, structured=FIVE_DIGITS))
    assert re.fullmatch("[0-9]{5}", out.text) and (out.finish_reason, out.stop_reason) == ("stop", "structured")
    assert out.structured["complete"] and out.structured["type"] == "regex" and out.structured["masks"] == 5
    assert out.structured["allowed_tokens"] == [10] * 5 and out.structured["draft_masks"] == 0
    short = generate(tiny_model, "hi", SamplingParams(max_tokens=3, temperature=0.0, structured=FIVE_DIGITS))
    assert (short.finish_reason, short.stop_reason, len(short.token_ids)) == ("length", None, 3)
    assert short.structured["complete"] is False and re.fullmatch("[0-9]{3}", short.text)
    assert "structured" not in generate(tiny_model, "hi", SamplingParams(max_tokens=2)).to_dict()


# ---------------------------------------------------------------------------------------------------- drafting ahead

def test_a_fork_drafts_ahead_without_moving_the_request_and_counts_its_masks_apart(tiny_model):
    tokenizer, V = tiny_model.tokenizer, tiny_model.config.vocab_size
    constraint = Constraint(StructuredOutputsParams(json=SMALL_OBJECT), tokenizer)
    fork = constraint.fork()
    first = fork.allowed(V)                                      # where the request stands: its own next mask
    assert constraint.allowed(V) is first and constraint.summary()["masks"] == 1
    for token in tokenizer.encode('{"a'):
        fork.accept(token)
        fork.allowed(V)
    assert constraint.summary()["masks"] == 1 and constraint.draft_masks == 3      # the fork's masks: drafts
    assert constraint.allowed(V) is first                        # the request has not moved
    quote = tokenizer.encode('"')[0]
    assert not first[quote] and fork.allowed(V)[quote]           # '"' may close the key now, not open the object
    text = tokenizer.encode('{"a": 7, "b": "x"}')
    constraint.accept(text[0])                                   # the request goes on as if no fork had been
    assert constraint.valid_prefix(text[1:]) == len(text) - 1
    assert constraint.valid_prefix(tokenizer.encode('"a": 7, "c"')) == len(tokenizer.encode('"a": 7, "'))
    assert constraint.valid_prefix([]) == 0 and constraint.draft_masks == 5
    summary = constraint.summary()
    assert summary["masks"] == 1 and summary["draft_masks"] == 5 and summary["draft_mask_s"] > 0


def test_the_ngram_drafter_cuts_its_guess_where_the_constraint_refuses_it(tiny_model):
    tokenizer = tiny_model.tokenizer
    context = tokenizer.encode("12ab12") + tokenizer.encode("ab")       # the last "b" followed by "12ab"
    constraint = Constraint(StructuredOutputsParams(regex="[0-9]{3}[a-z]*"), tokenizer)
    drafter = NgramDrafter(SpeculativeConfig("ngram"))
    guess = drafter.propose(context, 4, None, 0, None)[0]
    assert tokenizer.decode(guess) == "12ab"
    assert drafter.propose(context, 4, None, 0, None, constraint) == (tokenizer.encode("12"), None)
    for token in tokenizer.encode("12"):
        constraint.accept(token)
    assert drafter.propose(context, 4, None, 0, None, constraint)[0] == tokenizer.encode("1")    # "12" + "1"
    assert constraint.summary()["draft_masks"] == 2 and constraint.summary()["masks"] == 0


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory):
    from minitransformer import load_model
    return load_model(write_tiny_llama(tmp_path_factory.mktemp("draft") / "draft.gguf", seed=7))


@pytest.mark.parametrize("temperature", [0.0, HOT])
def test_a_model_drafter_draws_every_guess_under_the_mask_of_the_guesses_before_it(tiny_model, tiny_draft,
                                                                                      temperature):
    tokenizer, V = tiny_model.tokenizer, tiny_model.config.vocab_size
    params = SamplingParams(max_tokens=20, temperature=temperature, seed=1)
    context = tokenizer.encode("Give a number:")
    free = SecondModelDrafter(tiny_draft, 64, seed=1).propose(context, 5, params, len(context), tokenizer.eos_id)
    assert Constraint(FIVE_DIGITS, tokenizer).valid_prefix(free[0]) < 5    # unconstrained, it guesses elsewhere
    constraint = Constraint(FIVE_DIGITS, tokenizer)
    drafts, qs = SecondModelDrafter(tiny_draft, 64, seed=1).propose(context, 5, params, len(context),
                                                                     tokenizer.eos_id, constraint)
    assert len(drafts) == 5 and constraint.valid_prefix(drafts) == 5 and re.fullmatch("[0-9]{5}",
                                                                                     tokenizer.decode(drafts))
    ahead = constraint.fork()
    for draft, q in zip(drafts, qs):                             # q is the masked distribution the guess came from
        allowed = ahead.allowed(V)
        assert q[~allowed].sum() == 0 and q[draft] > 0 and q.sum() == pytest.approx(1.0, abs=1e-5)
        ahead.accept(draft)
    assert constraint.summary()["masks"] == 1                    # the request's own mask: the first position only


def test_a_model_drafter_stops_guessing_once_the_constraint_is_complete(tiny_model, tiny_draft):
    tokenizer = tiny_model.tokenizer
    constraint = Constraint(StructuredOutputsParams(choice=["ok"]), tokenizer)
    params = SamplingParams(max_tokens=20, temperature=0.0)
    drafts, qs = SecondModelDrafter(tiny_draft, 64, seed=None).propose([5, 6], 6, params, 2, tokenizer.eos_id,
                                                                        constraint)
    assert tokenizer.decode(drafts) == "ok" and len(qs) == len(drafts) <= 2


CONSTRAINED_TINY = [
    SamplingParams(max_tokens=30, temperature=0.0, structured=StructuredOutputsParams(json=SMALL_OBJECT)),
    SamplingParams(max_tokens=30, temperature=0.0,
                   structured=StructuredOutputsParams(regex="[a-z]{3,8}( [a-z]{2,5}){2,4}")),
    SamplingParams(max_tokens=12, temperature=0.0,
                   structured=StructuredOutputsParams(choice=["hello world", "hello there", "bye"])),
    SamplingParams(max_tokens=30, temperature=0.0, repetition_penalty=1.4, min_tokens=6,
                   structured=StructuredOutputsParams(grammar='root ::= "(" [a-z]+ ")" | "[" [0-9]+ "]"')),
]


@pytest.mark.parametrize("drafter", ["ngram", "self:1", "model"])
def test_speculative_constrained_greedy_equals_constrained_greedy_on_the_tiny_model(tiny_model, tiny_draft,
                                                                                      drafter):
    spec = tiny_draft if drafter == "model" else drafter
    drafted = 0
    for params in CONSTRAINED_TINY:
        plain = generate(tiny_model, "hello world hello", params)
        out = generate(tiny_model, "hello world hello", params, runner=speculative_runner(spec, 3))
        assert out.token_ids == plain.token_ids and (out.text, out.finish_reason) == (plain.text,
                                                                                      plain.finish_reason)
        assert out.structured["masks"] == plain.structured["masks"]     # drafts never add to the per-token count
        assert out.structured["complete"] == plain.structured["complete"]
        drafted += out.speculative["draft_tokens"]
        assert drafts_inside_the_constraint(tiny_model.tokenizer, params, out)
    assert drafted > 0


def drafts_inside_the_constraint(tokenizer, params, out) -> bool:
    """Replay the verify passes on a fresh matcher: each pass's drafts are valid where they were drafted (after
    the tokens the passes before it emitted: their kept drafts and the target's own token)."""
    constraint = Constraint(params.structured, tokenizer)
    for drafted, accepted, target_token in out.speculative["passes"]:
        assert constraint.valid_prefix(drafted) == len(drafted), drafted
        for token in drafted[:accepted] + ([] if target_token is None else [target_token]):
            constraint.accept(token)
    return True


def test_speculative_constrained_sampling_is_seeded_and_stays_inside_the_constraint(tiny_model, tiny_draft):
    params = SamplingParams(max_tokens=24, temperature=HOT, seed=4,
                            structured=StructuredOutputsParams(regex="[a-z]{2,6}( [a-z]{2,6})+"))
    for spec in ("self:1", tiny_draft):
        a = generate(tiny_model, "abc abc", params, runner=speculative_runner(spec, 3))
        b = generate(tiny_model, "abc abc", params, runner=speculative_runner(spec, 3))
        assert a.token_ids == b.token_ids and a.speculative["draft_tokens"] > 0
        constraint = Constraint(params.structured, tiny_model.tokenizer)
        assert constraint.valid_prefix(a.token_ids) == len(a.token_ids)


# ---------------------------------------------------------------------------------------------------- the engine

ENGINE_MIXED = [
    ("hello", SamplingParams(max_tokens=20, temperature=0.0, structured=StructuredOutputsParams(json=SMALL_OBJECT))),
    ("abc", SamplingParams(max_tokens=20, temperature=HOT, seed=3,
                           structured=StructuredOutputsParams(json=SMALL_OBJECT))),
    ("the", SamplingParams(max_tokens=14, temperature=HOT, seed=5,
                           structured=StructuredOutputsParams(regex="[a-z]{2,4}(-[0-9]{2})+"))),
    ("x", SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)),
    ("hi there", SamplingParams(max_tokens=12, temperature=HOT, seed=9,
                                structured=StructuredOutputsParams(choice=["alpha", "beta"]))),
    ("in the", SamplingParams(max_tokens=18, temperature=HOT, seed=2, ignore_eos=True)),
    ("a", SamplingParams(max_tokens=16, temperature=0.0, structured=StructuredOutputsParams(json_object=True))),
    ("the the", SamplingParams(max_tokens=16, temperature=HOT, seed=8,
                               structured=StructuredOutputsParams(grammar='start: /[a-c]{3,9}/'))),
]


def test_the_engine_mixes_constrained_and_free_requests_through_preemption(tiny_model):
    """Each request has its own matcher, advanced only by its own sampled tokens: a recompute after preemption
    re-prefills the tokens (num_computed_tokens back to 0) without appending them again."""
    engine = Engine(tiny_model, max_num_seqs=6, num_blocks=14, block_size=4, enable_prefix_caching=False)
    ids = {engine.add_request(prompt, params): (prompt, params) for prompt, params in ENGINE_MIXED}
    preempted_constrained = set()
    results = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.result
        for rid, seq in engine.sequences.items():
            if seq.status is SequenceStatus.PREEMPTED and seq.constraint is not None:
                preempted_constrained.add(rid)
    assert preempted_constrained                                   # the pool is too small: recompute happened
    for rid, (prompt, params) in ids.items():
        ref, got = generate(tiny_model, prompt, params), results[rid]
        assert got.token_ids == ref.token_ids, (rid, params)
        assert (got.text, got.finish_reason, got.stop_reason) == (ref.text, ref.finish_reason, ref.stop_reason)
        if params.structured is not None:
            assert got.structured["masks"] == ref.structured["masks"] == len(got.token_ids)
            assert got.structured["complete"] == ref.structured["complete"]
    assert engine.block_manager.num_free_blocks == 14


def test_aborting_a_constrained_request_frees_its_blocks(tiny_model):
    engine = Engine(tiny_model, num_blocks=16, block_size=4)
    victim = engine.add_request("hello", SamplingParams(max_tokens=20, temperature=0.0,
                                                        structured=StructuredOutputsParams(json=SMALL_OBJECT)))
    other = engine.add_request("abc", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    engine.step()
    engine.step()
    engine.abort(victim)
    assert victim not in engine.block_manager.block_tables
    results = engine.run()
    assert results[other].token_ids == generate(tiny_model, "abc", SamplingParams(max_tokens=8, temperature=0.0,
                                                                                   ignore_eos=True)).token_ids
    assert engine.block_manager.num_free_blocks == 16


def test_a_bad_constraint_is_refused_before_the_engine_takes_the_request(tiny_model):
    engine = Engine(tiny_model, num_blocks=16, block_size=4)
    with pytest.raises(InputError, match="invalid regex"):
        engine.add_request("hi", SamplingParams(structured=StructuredOutputsParams(regex="((")))
    assert not engine.has_unfinished_requests()


# ---------------------------------------------------------------------------------------------------- the real model

def valid(text: str, schema: dict) -> bool:
    """The output parses as JSON and validates against its schema (raises with the reason otherwise)."""
    jsonschema.validate(json.loads(text), schema)
    return True


def schema_params(schema, **kw) -> SamplingParams:
    return SamplingParams(max_tokens=kw.pop("max_tokens", 120), structured=StructuredOutputsParams(json=schema), **kw)


@pytest.fixture(scope="module")
def greedy_schemas(real_model):
    """The 10 schemas, constrained greedy through generate() (chat prompts, as a user would ask)."""
    return [generate(real_model, prompt, schema_params(schema, temperature=0.0), chat=True)
            for _, schema, prompt in SCHEMAS]


def test_every_schema_greedy_output_parses_and_validates(greedy_schemas):
    for (name, schema, _), out in zip(SCHEMAS, greedy_schemas):
        assert out.finish_reason == "stop" and out.structured["complete"], (name, out.text)
        assert valid(out.text, schema), name


def test_every_schema_sampled_output_parses_and_validates_with_five_seeds(real_model):
    """50 seeded requests in one engine (batched: the engine gives each request the tokens generate() gives it,
    test_serving_engine.py and the mixed test below)."""
    engine = Engine(real_model, max_num_seqs=25)
    requests = {engine.add_request(prompt, schema_params(schema, temperature=0.8, seed=seed), chat=True):
                (name, schema) for name, schema, prompt in SCHEMAS for seed in range(5)}
    results = engine.run()
    for rid, (name, schema) in requests.items():
        assert results[rid].finish_reason == "stop", (name, results[rid].text)
        assert valid(results[rid].text, schema), name
    assert len({results[rid].text for rid in requests}) > 10                     # the seeds really differ


def test_a_streamed_schema_output_is_its_deltas_and_validates(real_model, greedy_schemas):
    for index in (0, 3):
        name, schema, prompt = SCHEMAS[index]
        deltas = list(stream(real_model, prompt, schema_params(schema, temperature=0.0), chat=True))
        final = deltas[-1].result
        assert "".join(d.text for d in deltas) == final.text == greedy_schemas[index].text
        assert [t for d in deltas for t in d.token_ids] == final.token_ids and valid(final.text, schema)


def test_eight_mixed_concurrent_requests_give_the_tokens_they_give_alone(real_model):
    mixed = [
        (SCHEMAS[0][2], schema_params(SCHEMAS[0][1], max_tokens=40, temperature=0.0)),
        (SCHEMAS[4][2], schema_params(SCHEMAS[4][1], max_tokens=40, temperature=0.7, seed=1)),
        (REGEXES[0][1], SamplingParams(max_tokens=12, temperature=0.0,
                                       structured=StructuredOutputsParams(regex=REGEXES[0][0]))),
        (CHOICES[2][1], SamplingParams(max_tokens=8, temperature=0.9, seed=2,
                                       structured=StructuredOutputsParams(choice=CHOICES[2][0]))),
        ("Say hello.", SamplingParams(max_tokens=20, temperature=0.0)),
        ("Write a list of fruits.", SamplingParams(max_tokens=20, temperature=0.8, seed=3)),
        ("A JSON object describing a dog:", SamplingParams(max_tokens=30, temperature=0.0,
                                                           structured=StructuredOutputsParams(json_object=True))),
        ("Count: ", SamplingParams(max_tokens=16, temperature=0.6, seed=4,
                                   structured=StructuredOutputsParams(grammar='root ::= [0-9] ("," [0-9])*'))),
    ]
    engine = Engine(real_model, max_num_seqs=8)
    ids = {engine.add_request(prompt, params, chat=True): (prompt, params) for prompt, params in mixed}
    results = engine.run()
    for rid, (prompt, params) in ids.items():
        ref, got = generate(real_model, prompt, params, chat=True), results[rid]
        assert (got.token_ids, got.text, got.finish_reason) == (ref.token_ids, ref.text, ref.finish_reason), rid
    outs = [results[rid] for rid in ids]
    assert valid(outs[0].text, SCHEMAS[0][1]) and valid(outs[1].text, SCHEMAS[4][1])
    assert re.fullmatch(REGEXES[0][0], outs[2].text) and outs[3].text in CHOICES[2][0]
    assert outs[6].structured["type"] == "json_object" and outs[7].structured["type"] == "grammar"


def run_in_engine(model, requests: list[tuple[str, SamplingParams]]) -> list:
    """Results of `requests`, in order, from one engine run (batched: the engine gives each request the tokens
    generate() gives it alone, as the mixed test above checks)."""
    engine = Engine(model, max_num_seqs=len(requests))
    ids = [engine.add_request(prompt, params) for prompt, params in requests]
    results = engine.run()
    return [results[rid] for rid in ids]


def test_twenty_regexes_are_matched_whole(real_model):
    requests = [(prompt, SamplingParams(max_tokens=24, temperature=temperature, seed=seed,
                                        structured=StructuredOutputsParams(regex=regex)))
                for seed, (regex, prompt) in enumerate(REGEXES) for temperature in (0.0, 1.0)]
    for (_, params), out in zip(requests, run_in_engine(real_model, requests)):
        regex = params.structured.regex
        assert re.fullmatch(regex, out.text), (regex, out.text)
        assert out.finish_reason == "stop" and out.structured["complete"]


def test_twenty_choice_lists_give_one_of_their_choices(real_model):
    requests = [(prompt, SamplingParams(max_tokens=8, temperature=temperature, seed=seed,
                                        structured=StructuredOutputsParams(choice=choices)))
                for seed, (choices, prompt) in enumerate(CHOICES) for temperature in (0.0, 1.0)]
    for (_, params), out in zip(requests, run_in_engine(real_model, requests)):
        assert out.text in params.structured.choice and out.finish_reason == "stop", (params.structured, out.text)


SPECULATIVE_REGEXES = [REGEXES[4], REGEXES[12]]


@pytest.fixture(scope="module")
def greedy_regexes(real_model):
    return [generate(real_model, prompt, SamplingParams(max_tokens=24, temperature=0.0,
                                                        structured=StructuredOutputsParams(regex=regex)))
            for regex, prompt in SPECULATIVE_REGEXES]


@pytest.mark.parametrize("drafter", ["ngram", "self:8", "model"])
def test_speculative_constrained_greedy_equals_constrained_greedy(real_model, greedy_schemas, greedy_regexes,
                                                                   drafter):
    spec = real_model if drafter == "model" else drafter
    accepted = 0
    for index in (0, 4):
        _, schema, prompt = SCHEMAS[index]
        out = generate(real_model, prompt, schema_params(schema, temperature=0.0), chat=True,
                       runner=speculative_runner(spec, 4))
        assert out.token_ids == greedy_schemas[index].token_ids, (drafter, index)
        accepted += out.speculative["accepted_tokens"]
    for (regex, prompt), plain in zip(SPECULATIVE_REGEXES, greedy_regexes):
        params = SamplingParams(max_tokens=24, temperature=0.0, structured=StructuredOutputsParams(regex=regex))
        out = generate(real_model, prompt, params, runner=speculative_runner(spec, 4))
        assert out.token_ids == plain.token_ids and out.text == plain.text, (drafter, regex)
        assert drafts_inside_the_constraint(real_model.tokenizer, params, out)
        accepted += out.speculative["accepted_tokens"]
    assert accepted > 0


def test_a_constraint_that_cannot_complete_ends_with_length(real_model):
    _, schema, prompt = SCHEMAS[7]
    out = generate(real_model, prompt, schema_params(schema, max_tokens=10, temperature=0.0), chat=True)
    assert (out.finish_reason, out.stop_reason, len(out.token_ids)) == ("length", None, 10)
    assert out.structured["complete"] is False and out.structured["masks"] == 10

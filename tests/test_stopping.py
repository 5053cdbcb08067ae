"""Stop rules: stop strings across token boundaries, earliest-wins, include_stop_str_in_output, min_tokens, EOS vs
max_tokens, stop token ids, context length, timeout and cancel. Token sequences come from the real tokenizer, so a
stop string that spans tokens really does; every length is counted in token ids."""

import threading
from types import SimpleNamespace

import pytest

from minitransformer.core.detokenizer import IncrementalDetokenizer
from minitransformer.core.metrics import now
from minitransformer.core.sampling import SamplingParams
from minitransformer.core.stopping import StopDecision, check_abort, check_stop, tokens_to_suppress

PARIS = "The capital of France is Paris."     # 'The', ' capital', ' of', ' France', ' is', ' Paris', '.'


def params(**overrides):
    """SamplingParams with room for 64 tokens unless the test says otherwise."""
    return SamplingParams(**{"max_tokens": 64, **overrides})


def run(tok, ids, p, prompt_len=0, context_length=8192):
    """Feed ids one at a time in generate.py's order: detokenize -> stop check -> stream. Stops at the decision."""
    detok, out, deltas = IncrementalDetokenizer(tok, p.stop), [], []
    decision = None
    for token in ids:
        out.append(token)
        new_chars = detok.add_token(token)
        decision = check_stop(p, detok, out, new_chars, tok.eos_id, prompt_len, context_length)
        if decision is not None:
            if decision.truncate_to is not None:
                detok.truncate(decision.truncate_to)
            break
        deltas.append(detok.take_delta())
    deltas.append(detok.take_delta(final=True))
    assert "".join(deltas) == detok.text
    return SimpleNamespace(text=detok.text, deltas=deltas, decision=decision, used=len(out))


def first_n_containing(tok, ids, stop):
    """Independent reference: the fewest tokens whose whole decode contains the stop string."""
    return next(n for n in range(1, len(ids) + 1) if stop in tok.decode(ids[:n]))


def tokens_spanned(tok, ids, stop):
    """How many tokens the first occurrence of stop overlaps (ASCII text: characters == bytes)."""
    ends = [len(tok.decode(ids[:n])) for n in range(len(ids) + 1)]
    start = tok.decode(ids).index(stop)
    return sum(1 for i in range(len(ids)) if ends[i] < start + len(stop) and ends[i + 1] > start)


@pytest.fixture(scope="module")
def tok(real_tokenizer):
    return real_tokenizer


# ---- stop strings


@pytest.mark.parametrize("stop, spans", [("ance is", 2), ("ance is Par", 3)])
def test_stop_string_spanning_tokens(tok, stop, spans):
    ids = tok.encode(PARIS)
    assert tokens_spanned(tok, ids, stop) == spans
    r = run(tok, ids, params(stop=(stop,)))
    assert r.decision == StopDecision("stop", stop, len("The capital of Fr"))
    assert r.text == "The capital of Fr"
    assert r.used == first_n_containing(tok, ids, stop) == 3 + spans     # stops at the token that completes it
    assert not any(stop in "".join(r.deltas[:k]) for k in range(len(r.deltas) + 1))


def test_stop_string_at_the_very_start(tok):
    ids = tok.encode("Hello two")
    r = run(tok, ids, params(stop=("Hel",)))
    assert (r.decision.finish_reason, r.decision.stop_reason, r.text, r.used) == ("stop", "Hel", "", 1)
    assert r.deltas == [""]


def test_overlapping_prefix_holds_back_only_the_real_prefix(tok):
    a, b = tok.encode("a"), tok.encode("b")
    assert len(a) == len(b) == 1
    p = params(stop=("ab",))
    detok, out = IncrementalDetokenizer(tok, p.stop), []
    steps = []
    for token in a + a + b:                      # "a", "a", "b": the stop "ab" starts at the second "a"
        out.append(token)
        decision = check_stop(p, detok, out, detok.add_token(token), tok.eos_id, 0, 8192)
        steps.append(decision or detok.take_delta())
    assert steps[:2] == ["", "a"]                # the first "a" waits, then is released when the second one comes
    assert steps[2] == StopDecision("stop", "ab", 1)
    detok.truncate(1)
    assert detok.take_delta(final=True) == "" and detok.text == "a"
    # The same text as the tokenizer cuts it ('a', 'ab'): the stop lies inside the second token.
    ids = tok.encode("aab")
    assert len(ids) == 2
    r = run(tok, ids, params(stop=("ab",)))
    assert (r.text, r.used, r.decision.stop_reason) == ("a", 2, "ab")


def test_earliest_stop_string_wins(tok):
    r = run(tok, tok.encode(PARIS), params(stop=("Paris", " is", "capital")))
    assert (r.decision.stop_reason, r.text, r.used) == ("capital", "The ", 2)
    # Both complete in the same token ' two': the one that starts first wins, whatever the list order.
    r = run(tok, tok.encode("Hello two"), params(stop=("wo", "tw")))
    assert (r.decision.stop_reason, r.text, r.used) == ("tw", "Hello ", 2)
    # Same start: the shorter one, whose end the text reached first.
    r = run(tok, tok.encode("Hello two"), params(stop=("two", "tw"), include_stop_str_in_output=True))
    assert (r.decision.stop_reason, r.text) == ("tw", "Hello tw")


def test_include_stop_str_in_output(tok):
    ids = tok.encode(PARIS)
    cut = run(tok, ids, params(stop=("Par",)))
    kept = run(tok, ids, params(stop=("Par",), include_stop_str_in_output=True))
    assert cut.text == "The capital of France is "
    assert kept.text == "The capital of France is Par"          # through its end; the rest of ' Paris' is cut
    assert cut.used == kept.used == 6
    assert kept.decision == StopDecision("stop", "Par", len(kept.text))


def test_stop_string_inside_min_tokens_is_not_matched(tok):
    ids = tok.encode("Hello two")
    r = run(tok, ids, params(stop=("Hel",), min_tokens=2, max_tokens=2))
    assert (r.decision.finish_reason, r.text, r.used) == ("length", "Hello two", 2)


def test_stop_string_wins_over_length_on_the_same_token(tok):
    r = run(tok, tok.encode("Hello two"), params(stop=("two",), max_tokens=2))
    assert (r.decision.finish_reason, r.decision.stop_reason, r.text) == ("stop", "two", "Hello ")


# ---- EOS, min_tokens, max_tokens, stop token ids, context


def test_min_tokens_holds_back_eos(tok):
    eos = tok.eos_id
    ids = tok.encode("Hi") + [eos] + tok.encode(" there") + [eos]
    r = run(tok, ids, params(min_tokens=3))
    assert r.decision == StopDecision("stop", "eos") and r.used == 4
    assert r.text == "Hi there" == tok.decode(ids, skip_special=True)
    assert run(tok, ids, params(min_tokens=2)).used == 2      # reached: the EOS at output length 2 counts


def test_tokens_to_suppress_until_min_tokens(tok):
    p = params(min_tokens=3, stop_token_ids=(314, 2, 314))
    assert tokens_to_suppress(p, 0, 2) == tokens_to_suppress(p, 2, 2) == (2, 314)
    assert tokens_to_suppress(p, 3, 2) == ()
    assert tokens_to_suppress(params(min_tokens=3, ignore_eos=True, stop_token_ids=(314,)), 1, 2) == (314,)
    assert tokens_to_suppress(params(), 0, 2) == ()


def test_eos_exactly_at_max_tokens_is_stop(tok):
    ids = tok.encode("Hi there") + [tok.eos_id]
    r = run(tok, ids, params(max_tokens=3))
    assert (r.decision, r.used, r.text) == (StopDecision("stop", "eos"), 3, "Hi there")
    r = run(tok, ids, params(max_tokens=2))
    assert (r.decision, r.used, r.text) == (StopDecision("length", None), 2, "Hi there")


def test_ignore_eos(tok):
    ids = tok.encode("Hi") + [tok.eos_id] + tok.encode(" there")
    r = run(tok, ids, params(ignore_eos=True, max_tokens=3))
    assert (r.decision, r.used, r.text) == (StopDecision("length", None), 3, "Hi there")
    # A stop token id still stops even when it is the EOS id; stop_reason is then the id.
    r = run(tok, ids, params(ignore_eos=True, stop_token_ids=(tok.eos_id,)))
    assert r.decision == StopDecision("stop", tok.eos_id) and r.used == 2


def test_stop_token_ids(tok):
    ids = tok.encode(PARIS)
    is_id = ids[4]
    assert tok.decode([is_id]) == " is"
    r = run(tok, ids, params(stop_token_ids=(is_id,)))
    assert r.decision.finish_reason == "stop" and type(r.decision.stop_reason) is int
    assert (r.decision.stop_reason, r.used) == (is_id, 5)
    assert r.text == "The capital of France"             # vLLM cuts the stop token's text ...
    r = run(tok, ids, params(stop_token_ids=(is_id,), include_stop_str_in_output=True))
    assert r.text == "The capital of France is" and r.decision.truncate_to is None   # ... unless asked to keep it


def test_context_length_gives_length(tok):
    ids = tok.encode(PARIS)
    r = run(tok, ids, params(max_tokens=64), prompt_len=10, context_length=13)
    assert (r.decision, r.used) == (StopDecision("length", None), 3)
    assert r.text == "The capital of"


def test_lengths_are_counted_in_token_ids(tok):
    byte_id = {tok.token_bytes(i): i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1}
    ids = [byte_id[bytes([b])] for b in "😀😀".encode()]           # 8 byte tokens, 2 characters
    r = run(tok, ids, params(max_tokens=6))
    assert (r.decision.finish_reason, r.used) == ("length", 6)
    assert r.text == "😀\ufffd"          # the unfinished second emoji is flushed as U+FFFD, as decode() gives
    assert r.text == tok.decode(ids[:6])
    assert len(tok.encode(r.text)) != 6   # re-encoding the text would have counted something else


# ---- abort


def test_timeout_and_cancel():
    cancel = threading.Event()
    assert check_abort(None, None) is None
    assert check_abort(now() + 60, cancel) is None
    assert check_abort(now() - 0.001, None) == StopDecision("abort", "timeout")
    cancel.set()
    assert check_abort(None, cancel) == StopDecision("abort", "cancelled")
    assert check_abort(now() + 60, cancel) == StopDecision("abort", "cancelled")


def test_a_stop_token_that_only_begins_a_character_leaves_no_replacement_char(tok):
    """The stop token's text is cut even when it is half a UTF-8 character (its bytes never become U+FFFD)."""
    first_bytes = tok.encode("😀")[0]                    # a token that only starts the 4-byte emoji (F0 9F)
    assert "😀".encode().startswith(tok.token_bytes(first_bytes)) and len(tok.token_bytes(first_bytes)) < 4
    ids = tok.encode("Hi") + [first_bytes]
    r = run(tok, ids, params(stop_token_ids=(first_bytes,)))
    assert (r.decision.finish_reason, r.decision.stop_reason, r.text) == ("stop", first_bytes, "Hi")
    kept = run(tok, ids, params(stop_token_ids=(first_bytes,), include_stop_str_in_output=True))
    assert kept.text == "Hi\ufffd"                      # kept: the unfinished byte is flushed as U+FFFD

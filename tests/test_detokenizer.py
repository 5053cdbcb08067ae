"""Streaming detokenizer: characters split across byte tokens, invalid bytes, control tokens, the stop-string
hold-back, and a property test of the whole detokenize -> stop check -> stream loop on random token sequences of the
real tokenizer against a brute-force reference that re-decodes the full prefix after every token."""

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from minitransformer.core.detokenizer import IncrementalDetokenizer
from minitransformer.core.sampling import SamplingParams
from minitransformer.core.stopping import check_stop


@pytest.fixture(scope="module")
def tok(real_tokenizer):
    return real_tokenizer


@pytest.fixture(scope="module")
def byte_id(tok):
    """byte value -> the id of the token that is exactly that byte (235 of the 256 bytes have one)."""
    ids = {tok.token_bytes(i): i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1}
    return {b[0]: i for b, i in ids.items()}


def stream(tok, ids, stop=(), skip_special=True):
    """(text after each token, delta after each token, final delta) with no stop check."""
    detok = IncrementalDetokenizer(tok, stop, skip_special)
    texts, deltas = [], []
    for token in ids:
        detok.add_token(token)
        texts.append(detok.text)
        deltas.append(detok.take_delta())
    return texts, deltas, detok.take_delta(final=True)


# ---- characters and bytes


def test_emoji_split_into_byte_tokens_waits_for_its_last_byte(tok, byte_id):
    ids = [byte_id[b] for b in "a😀".encode()]                   # 'a' then the emoji's 4 bytes, one token each
    detok = IncrementalDetokenizer(tok)
    assert [detok.add_token(i) for i in ids] == [1, 0, 0, 0, 1]
    texts, deltas, final = stream(tok, ids)
    assert texts == ["a", "a", "a", "a", "a😀"]
    assert deltas == ["a", "", "", "", "😀"] and final == ""


def test_real_tokenization_of_emoji_and_cjk(tok):
    text = "😀 日本語 café 🎉👍🏽 🇫🇷"
    ids = tok.encode(text)
    assert len(ids) > len(text)                                  # some characters really are split across tokens
    texts, deltas, final = stream(tok, ids)
    assert "".join(deltas) + final == text
    assert all(text.startswith(t) for t in texts) and "\ufffd" not in "".join(deltas)


def test_invalid_bytes_become_replacement_characters_as_in_a_whole_decode(tok, byte_id):
    raw = b"\xe4x\xf0\x9f\x98A\x80\xe6\x97\xa5\xc3"            # cut 3-byte char, cut emoji, stray byte, 日, cut é
    ids = [byte_id[b] for b in raw]
    texts, deltas, final = stream(tok, ids)
    assert texts[0] == "" and texts[1] == "\ufffdx"              # \xe4 is only known to be invalid when 'x' comes
    assert texts[4] == "\ufffdx"                                 # \xf0\x9f\x98 may still become an emoji
    assert "".join(deltas) + final == raw.decode("utf-8", errors="replace") == tok.decode(ids)
    assert final == "\ufffd"                                     # the cut-off \xc3, flushed at the end


def test_control_tokens_are_skipped_or_shown(tok):
    ids = tok.encode("<|im_start|>assistant\nHi<|im_end|>", special=True)
    assert ids[0] in tok.control_ids and ids[-1] == tok.eos_id
    _, deltas, final = stream(tok, ids)
    assert "".join(deltas) + final == "assistant\nHi" == tok.decode(ids, skip_special=True)
    _, deltas, final = stream(tok, ids, skip_special=False)
    assert "".join(deltas) + final == "<|im_start|>assistant\nHi<|im_end|>"


def test_only_a_real_stop_prefix_is_held_back(tok):
    ids = tok.encode("xyz Hello world")                          # 'xyz', ' Hello', ' world'
    _, deltas, final = stream(tok, ids, stop=(" Hello!", "rld!"))
    # 'xyz' streams at once (a fixed window of len(stop) - 1 characters would hold it back);
    # ' Hello' could still become ' Hello!' and waits; then ' world' rules that out, but 'rld' could become 'rld!'.
    assert deltas == ["xyz", "", " Hello wo"]
    assert final == "rld"


def test_truncate(tok, byte_id):
    detok = IncrementalDetokenizer(tok)
    detok.add_token(tok.encode("Hello")[0])
    assert detok.take_delta() == "Hello"
    with pytest.raises(ValueError, match="already streamed"):
        detok.truncate(2)                                        # cutting text the user has seen is a caller bug
    detok.add_token(byte_id[0xF0])                               # an unfinished emoji after the cut ...
    detok.truncate(5)
    assert detok.take_delta(final=True) == "" and detok.text == "Hello"  # ... is dropped, not flushed as U+FFFD


# ---- the streaming property, on random token sequences


def settled(data: bytes) -> str:
    """Brute-force reference for the text a streamer may show after these bytes: the characters that no later bytes
    can change. A continuation byte from each range a UTF-8 lead byte allows (E0: A0-BF, ED: 80-9F, F0: 90-BF,
    F4: 80-8F) completes any unfinished character; 'A' makes it invalid. What all of them agree on is settled."""
    endings = (b"A", b"\x80\x80\x80", b"\x90\x80\x80", b"\xa0\x80\x80", b"\xbf\xbf\xbf")
    return os.path.commonprefix([(data + e).decode("utf-8", errors="replace") for e in endings])


def reference(tok, ids, p, prompt_len, context_length):
    """The stop rules by re-decoding the whole prefix after every token: (finish, stop_reason, tokens used, text)."""
    eos, before = tok.eos_id, ""
    for n in range(1, len(ids) + 1):
        last, whole = ids[n - 1], tok.decode(ids[:n], skip_special=True)
        now = settled(tok.decode_bytes(ids[:n], skip_special=True))
        token_stop = "eos" if last == eos and not p.ignore_eos else last if last in p.stop_token_ids else None
        if token_stop is not None:
            # the token's own text goes (unfinished bytes included) unless kept; a skipped EOS has none to cut
            cut = not p.include_stop_str_in_output and tok.decode_bytes([last], skip_special=True) != b""
            return "stop", token_stop, n, before if cut else whole
        hits = sorted((now.index(s), len(s), k, s) for k, s in enumerate(p.stop) if s in now)
        if hits:
            start, length, _, s = hits[0]
            return "stop", s, n, now[: start + length if p.include_stop_str_in_output else start]
        if n >= p.max_tokens or prompt_len + n >= context_length:
            return "length", None, n, whole
        before = now
    return None, None, len(ids), tok.decode(ids, skip_special=True)


PIECES = ["a", "b", "ab", " ", "Hello", " world", "é", "日本", "語", "😀", "👍🏽", "🇫🇷", "\n", " Paris", "."]
texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=6).map("".join)


@st.composite
def token_runs(draw, tok, byte_id):
    """Token ids: real encodings, the same text as single-byte tokens (characters split), random byte tokens (often
    invalid UTF-8), control tokens and any vocabulary id, in random order."""
    byte_ids = sorted(byte_id.values())
    part = st.one_of(
        texts.map(tok.encode),
        texts.map(lambda t: [byte_id[b] for b in t.encode()]),
        st.lists(st.sampled_from(byte_ids), min_size=1, max_size=4),
        st.sampled_from(sorted(tok.control_ids)).map(lambda i: [i]),
        st.integers(0, tok.vocab_size - 1).map(lambda i: [i]),
    )
    return [i for ids in draw(st.lists(part, min_size=1, max_size=8)) for i in ids]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_streaming_matches_a_full_decode(tok, byte_id, data):
    ids = data.draw(token_runs(tok, byte_id), label="ids")
    full = tok.decode(ids, skip_special=True)
    # Stop strings that do occur (substrings of the output) and some that may not.
    substrings = st.tuples(st.integers(0, len(full)), st.integers(1, 4)).map(lambda t: full[t[0] : t[0] + t[1]])
    stop = tuple(s for s in data.draw(st.lists(st.one_of(substrings, texts), max_size=3), label="stop") if s)
    p = SamplingParams(
        stop=stop, min_tokens=0, include_stop_str_in_output=data.draw(st.booleans(), label="include"),
        ignore_eos=data.draw(st.booleans(), label="ignore_eos"),
        stop_token_ids=tuple(data.draw(st.lists(st.sampled_from(ids), max_size=2), label="stop_token_ids")),
        max_tokens=data.draw(st.integers(1, len(ids) + 2), label="max_tokens"))
    prompt_len = data.draw(st.integers(0, 5), label="prompt_len")
    context_length = prompt_len + data.draw(st.integers(1, len(ids) + 2), label="room")

    detok, out, deltas, decision = IncrementalDetokenizer(tok, stop), [], [], None
    for token in ids:                                            # generate.py's order
        out.append(token)
        new_chars = detok.add_token(token)
        decision = check_stop(p, detok, out, new_chars, tok.eos_id, prompt_len, context_length)
        if decision is not None:
            if decision.truncate_to is not None:
                detok.truncate(decision.truncate_to)
            break
        deltas.append(detok.take_delta())
        shown = "".join(deltas)
        held = detok.text[len(shown):]
        assert detok.text == settled(tok.decode_bytes(out, skip_special=True))      # complete characters only
        if not p.include_stop_str_in_output:
            assert not any(s in shown for s in stop)             # no delta ever shows a stop string
        # What is held back is exactly the longest tail of the text that is a proper prefix of a stop string.
        is_prefix = [any(s.startswith(detok.text[len(detok.text) - k:]) and k < len(s) for s in stop)
                     for k in range(len(detok.text) + 1)]
        assert len(held) == max(k for k, ok in enumerate(is_prefix) if ok or k == 0)
    deltas.append(detok.take_delta(final=True))

    finish, stop_reason, used, text = reference(tok, ids, p, prompt_len, context_length)
    assert (decision.finish_reason if decision else None, decision.stop_reason if decision else None) == \
        (finish, stop_reason)
    assert len(out) == used
    assert "".join(deltas) == detok.text == text
    if decision is None or decision.finish_reason == "length" or decision.stop_reason == "eos":
        assert text == tok.decode(out, skip_special=True)        # nothing was cut: the full decode
    if "\ufffd" not in tok.decode(out, skip_special=True):
        assert not any("\ufffd" in d for d in deltas)            # no character split into replacement characters

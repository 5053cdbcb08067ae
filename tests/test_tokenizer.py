"""Tokenizer: same ids as llama.cpp (golden fixture + live when installed), the fast BPE merge equals the plain one,
lossless round trips, control tokens, chat template, errors."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from minitransformer.core.errors import InputError, ModelFileError
from minitransformer.core.tokenizer import BYTE_TO_CHAR, NORMAL, Tokenizer, bpe
from tokenizer_reference import live_rows, mismatches

FIXTURE = Path(__file__).parent / "fixtures" / "tokenizer_llamacpp.json"
CONTROL_TEXTS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<file_sep>", "<jupyter_code>",
                 "<empty_output>"]
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# The vocabulary has no token for these 6 ASCII control bytes, nor for 0xF1/0xF2, the UTF-8 lead bytes of the
# (unassigned) planes 4 to 11: llama.cpp drops them, and so do we, so text with them cannot round-trip.
UNTOKENIZABLE = "\x04\x06\x13\x14\x16\x1d"
characters = st.one_of(st.characters(codec="utf-8", max_codepoint=0x3FFFF, exclude_characters=UNTOKENIZABLE),
                       st.characters(codec="utf-8", min_codepoint=0xC0000))  # utf-8: no lone surrogates
# Broad text: any other code point, weighted towards whitespace, digits, apostrophes and emoji sequences,
# where pre-tokenizers differ.
TRICKY = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "'s", "'ll", "'S", "’s", "1", "42", "x  1", "👍🏽",
          "👩‍💻", "🇫🇷", "é", "日本", "Привет", "مرحبا"]
texts = st.lists(st.one_of(st.text(characters, max_size=12), st.sampled_from(TRICKY)), max_size=12).map("".join)
texts_with_control = st.lists(st.one_of(st.text(characters, max_size=8), st.sampled_from(TRICKY + CONTROL_TEXTS)),
                              max_size=12).map("".join)
hyp = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tokenizer(real_tokenizer):
    """The default model's tokenizer (conftest.py loads the model once per session)."""
    return real_tokenizer


# ---- same ids as llama.cpp


def test_fixture_matches_llamacpp(tokenizer):
    rows = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert len(rows) >= 2000 and any(r["special"] for r in rows)
    bad = mismatches(tokenizer, rows)
    assert not bad, f"{len(bad)} of {len(rows)} strings differ from llama.cpp; first ones:\n" + "\n".join(bad[:5])


@pytest.mark.peers
def test_live_against_llamacpp(tokenizer):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (the `peers` extra)")
    from minitransformer.models import resolve_model_path

    llm = llama_cpp.Llama(model_path=str(resolve_model_path(None)), vocab_only=True, verbose=False)
    rng = random.Random()  # fresh strings on every run; the seed is in the failure message
    seed = rng.randrange(2**32)
    rng.seed(seed)
    rows = live_rows(llm, rng, TRICKY * 10 + CONTROL_TEXTS * 3)
    bad = mismatches(tokenizer, rows)
    assert not bad, f"seed {seed}: {len(bad)} of {len(rows)} differ from llama.cpp:\n" + "\n".join(bad[:5])


# ---- the heap-based merge (bpe.py) gives the pieces of the plain loop


def plain_bpe(symbols, ranks):
    """The textbook loop: find the best-ranked adjacent pair, merge all its occurrences left to right, repeat."""
    while len(symbols) > 1:
        best = min(zip(symbols, symbols[1:]), key=lambda pair: ranks.get(pair, float("inf")))
        if best not in ranks:
            return symbols
        merged, i = [], 0
        while i < len(symbols):
            if tuple(symbols[i : i + 2]) == best:
                merged.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                merged.append(symbols[i])
                i += 1
        symbols = merged
    return symbols


@pytest.fixture(scope="module")
def vocabulary_pieces(tokenizer):
    return [t for t, kind in zip(tokenizer.tokens, tokenizer.token_types) if kind == NORMAL]


@hyp
@given(data=st.data())
def test_fast_bpe_equals_plain_bpe_on_words_of_vocabulary_pieces(tokenizer, vocabulary_pieces, data):
    # Concatenated pieces make words whose merges reach deep into the list (and across the pieces' borders).
    pieces = data.draw(st.lists(st.sampled_from(vocabulary_pieces), min_size=1, max_size=30))
    symbols = list("".join(pieces))
    assert bpe(symbols, tokenizer.ranks) == plain_bpe(symbols, tokenizer.ranks)


def test_fast_bpe_equals_plain_bpe_on_long_random_words(tokenizer):
    rng = random.Random(0)
    alphabets = ["ab", "abcdefghijklmnopqrstuvwxyz", "aeiou ĠĊ0123456789", "".join(BYTE_TO_CHAR.values())]
    for alphabet in alphabets:
        for length in (2, 3, 50, 700):
            symbols = [rng.choice(alphabet) for _ in range(length)]
            assert bpe(symbols, tokenizer.ranks) == plain_bpe(symbols, tokenizer.ranks), (alphabet, length)


def test_equal_pairs_merge_leftmost_first():
    ranks = {("a", "a"): 0, ("aa", "aa"): 1}
    assert bpe(list("aaa"), ranks) == ["aa", "a"]
    assert bpe(list("aaaaa"), ranks) == ["aaaa", "a"]
    assert bpe(["a"], ranks) == ["a"] and bpe([], ranks) == []


# ---- the pre-tokenizer facts the tokenizer relies on


def test_digits_are_split_and_no_bos_is_added(tokenizer):
    assert tokenizer.pieces(tokenizer.encode("2024")) == ["2", "0", "2", "4"]
    assert tokenizer.pieces(tokenizer.encode("x  1")) == ["x", "ĠĠ", "1"]  # transformers' GGUF tokenizer differs here
    assert tokenizer.pieces(tokenizer.encode("Hello world")) == ["Hello", "Ġworld"]  # no space prefix added
    assert tokenizer.encode("Hi")[0] != tokenizer.bos_id


def test_byte_map_is_a_bijection_onto_printable_characters():
    assert len(set(BYTE_TO_CHAR.values())) == 256
    assert BYTE_TO_CHAR[ord(" ")] == "Ġ" and BYTE_TO_CHAR[ord("\n")] == "Ċ" and BYTE_TO_CHAR[ord("a")] == "a"
    assert all(c.isprintable() and not c.isspace() for c in BYTE_TO_CHAR.values())


# ---- lossless round trips


@hyp
@given(text=texts)
def test_decode_encode_roundtrip(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@hyp
@given(text=texts_with_control)
def test_control_text_is_plain_text_without_special(tokenizer, text):
    ids = tokenizer.encode(text)
    assert not set(ids) & tokenizer.control_ids
    assert tokenizer.decode(ids) == text


@hyp
@given(text=texts_with_control)
def test_roundtrip_with_special(tokenizer, text):
    ids = tokenizer.encode(text, special=True)
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode_bytes(ids) == text.encode("utf-8")


def test_bytes_without_a_token_are_dropped_like_llamacpp(tokenizer):
    assert tokenizer.decode(tokenizer.encode("a\x1db")) == "ab"
    assert tokenizer.encode(UNTOKENIZABLE) == []


@pytest.mark.parametrize("limit", [0, 1, 7, 60])
def test_encode_with_a_limit_stops_one_pre_token_past_it(tokenizer, limit):
    text = "The quick brown fox, 2024 <|im_end|> jumps. " * 20
    for special in (False, True):
        full = tokenizer.encode(text, special=special)
        ids = tokenizer.encode(text, special=special, limit=limit)
        assert limit < len(ids) < len(full) and ids == full[: len(ids)]
        assert len(ids) - limit <= 4                    # no word of this text is more than 4 tokens
    messages = [{"role": "user", "content": text}]
    ids = tokenizer.encode_chat(messages, limit=limit)
    assert limit < len(ids) and ids == tokenizer.encode_chat(messages)[: len(ids)]
    assert tokenizer.encode("Hi there", limit=2) == tokenizer.encode("Hi there")   # within the limit: all of it


# ---- control tokens


def test_control_tokens(tokenizer):
    assert tokenizer.bos_id == 1 and tokenizer.eos_id == 2 and tokenizer.vocab_size == 49152
    assert tokenizer.control_ids == frozenset(range(17))
    assert tokenizer.encode("<|im_end|>", special=True) == [2]
    plain = tokenizer.encode("<|im_end|>")
    assert len(plain) > 1 and 2 not in plain
    ids = tokenizer.encode("<|im_start|>user\nhi<|im_end|>", special=True)
    assert ids[0] == 1 and ids[-1] == 2 and tokenizer.decode(ids[1:-1]) == "user\nhi"
    assert tokenizer.id_to_piece(2) == "<|im_end|>" and tokenizer.decode([2]) == "<|im_end|>"
    assert tokenizer.decode(ids, skip_special=True) == "user\nhi"


def test_decode_keeps_partial_utf8_as_bytes(tokenizer):
    ids = tokenizer.encode("😀")
    assert len(ids) > 1  # the emoji's 4 bytes are split over tokens
    assert tokenizer.decode_bytes(ids[:1]) == "😀".encode()[: len(tokenizer.decode_bytes(ids[:1]))]
    assert tokenizer.decode(ids[:1]).endswith("\ufffd")


# ---- chat template


def test_chat_inserts_default_system_prompt(tokenizer):
    text = tokenizer.render_chat([{"role": "user", "content": "Hi"}])
    assert text == (f"<|im_start|>system\n{DEFAULT_SYSTEM}<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.encode(text, special=True)[0] == tokenizer.bos_id


def test_chat_with_system_message_and_no_generation_prompt(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"}]
    text = tokenizer.render_chat(messages, add_generation_prompt=False)
    assert DEFAULT_SYSTEM not in text
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\nHello!<|im_end|>\n")


@pytest.mark.parametrize("messages", [
    "Hi", [], [{"content": "Hi"}], [{"role": "user"}], [{"role": "user", "content": 3}], ["Hi"], {"role": "user"},
    [{"role": "", "content": "Hi"}],
])
def test_malformed_messages_raise_input_error(tokenizer, messages):
    with pytest.raises(InputError) as e:
        tokenizer.render_chat(messages)
    assert "\n" not in str(e.value)


# ---- errors


@pytest.mark.parametrize("bad", [-1, 49152, 10**9])
def test_decode_rejects_out_of_range_ids(tokenizer, bad):
    with pytest.raises(InputError, match=rf"{bad}.*49152"):
        tokenizer.decode([5, bad])
    with pytest.raises(InputError):
        tokenizer.id_to_piece(bad)


@pytest.mark.parametrize("bad", ["3", 1.5, None])
def test_decode_rejects_non_integer_ids(tokenizer, bad):
    with pytest.raises(InputError):
        tokenizer.decode([bad])


def test_encode_rejects_non_text(tokenizer):
    with pytest.raises(InputError):
        tokenizer.encode(b"bytes")
    with pytest.raises(InputError, match="surrogate"):
        tokenizer.encode("ok \ud800")  # e.g. undecodable command-line bytes under surrogateescape


class FakeField:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


@pytest.mark.parametrize("fields, message", [
    ({"tokenizer.ggml.model": "bert"}, "'bert' is not supported"),
    ({"tokenizer.ggml.model": "llama"}, "no 'tokenizer.ggml.scores'"),
    ({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2"}, "'qwen2' is not supported"),
    ({"tokenizer.ggml.model": "gpt2"}, "'default' is not supported"),
    ({}, "no 'tokenizer.ggml.model'"),
])
def test_unsupported_tokenizers_are_refused_with_one_line(fields, message):
    fields = {"tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": ["a b"], **fields}

    class Reader:
        pass

    reader = Reader()
    reader.fields = {k: FakeField(v) for k, v in fields.items()}
    with pytest.raises(ModelFileError, match=message) as e:
        Tokenizer.from_gguf(reader)
    assert "\n" not in str(e.value)

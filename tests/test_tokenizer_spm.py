"""The SentencePiece-style tokenizer (spm.py): the merge by score on a tiny hand-made vocabulary written as a real
GGUF, and Gemma 3's ids == llama.cpp's (golden fixture, and live when llama-cpp-python is installed)."""

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from minitransformer.core.detokenizer import IncrementalDetokenizer
from minitransformer.core.errors import ModelFileError
from minitransformer.core.spm import merge_by_score
from minitransformer.core.tokenizer import CONTROL, Tokenizer, load_tokenizer
from tiny_model import write_tiny_spm
from tokenizer_reference import live_rows, mismatches

FIXTURE = Path(__file__).parent / "fixtures" / "tokenizer_gemma3_llamacpp.json"


@pytest.fixture(scope="module")
def tiny_spm(tmp_path_factory):
    return load_tokenizer(write_tiny_spm(tmp_path_factory.mktemp("spm") / "tiny-spm.gguf"))


@pytest.fixture(scope="module")
def tiny_spm_prefixed(tmp_path_factory):
    return load_tokenizer(write_tiny_spm(tmp_path_factory.mktemp("spm") / "tiny-spm-prefix.gguf",
                                         add_space_prefix=True))


# ---- the algorithm on a vocabulary small enough to follow by hand


def test_highest_score_merges_first_and_merged_symbols_merge_again(tiny_spm):
    # "abc": "ab" (-6) beats "bc" (-7); then "ab" + "c" is "abc". " ab": "▁a" (-5) beats "ab", then "▁a" + "b".
    assert tiny_spm.pieces(tiny_spm.encode("abc")) == ["abc"]
    assert tiny_spm.pieces(tiny_spm.encode(" ab")) == ["▁ab"]
    assert tiny_spm.pieces(tiny_spm.encode("abc ab aab")) == ["abc", "▁ab", "▁a", "ab"]


def test_equal_scores_merge_leftmost_first():
    vocab = {"a": 0, "aa": 1}
    assert merge_by_score("aaa", vocab, [0.0, -1.0]) == ["aa", "a"]
    assert merge_by_score("aaaaa", vocab, [0.0, -1.0]) == ["aa", "aa", "a"]
    assert merge_by_score("", vocab, [0.0, -1.0]) == [] and merge_by_score("a", vocab, [0.0, -1.0]) == ["a"]


def test_a_merged_away_symbol_is_never_merged_again():
    """The pair queued before its left symbol was merged away must be skipped (the bug a length check alone
    misses: an empty symbol plus its neighbour has the neighbour's length)."""
    vocab = {"mo": 0, "mod": 1, "model": 2, "od": 3, "de": 4, "del": 5, "el": 6}
    scores = [-795.0, -1407.0, -3874.0, -96.0, -399.0, -7302.0, -41.0]           # Gemma 3's own scores
    assert merge_by_score("model", vocab, scores) == ["model"]


def test_characters_without_a_token_fall_back_to_byte_tokens(tiny_spm):
    assert tiny_spm.pieces(tiny_spm.encode("d")) == ["<0x64>"]
    assert tiny_spm.pieces(tiny_spm.encode("aé€")) == ["a", "é", "<0xE2>", "<0x82>", "<0xAC>"]
    assert tiny_spm.decode(tiny_spm.encode("aé€")) == "aé€"


def test_spaces_are_written_as_the_space_marker(tiny_spm):
    assert tiny_spm.pieces(tiny_spm.encode("a  c")) == ["a", "▁", "▁", "c"]
    assert tiny_spm.decode(tiny_spm.encode(" a  c ")) == " a  c "
    assert tiny_spm.token_bytes(tiny_spm.token_to_id["▁a"]) == b" a"


def test_control_tokens_only_with_special_user_defined_always(tiny_spm):
    eos = tiny_spm.token_to_id["<eos>"]
    assert tiny_spm.encode("a<eos>", special=True) == [tiny_spm.token_to_id["a"], eos]
    assert eos not in tiny_spm.encode("a<eos>")
    assert tiny_spm.decode(tiny_spm.encode("a<eos>")) == "a<eos>"
    assert tiny_spm.pieces(tiny_spm.encode("a\n\nb<b>")) == ["a", "\n\n", "b", "<b>"]
    assert tiny_spm.decode([eos, tiny_spm.token_to_id["a"]], skip_special=True) == "a"


def test_space_prefix_and_bos_follow_the_file(tiny_spm, tiny_spm_prefixed):
    assert tiny_spm.add_bos and tiny_spm.bos_id == 2 and not tiny_spm.spm.add_space_prefix
    assert tiny_spm.encode("ab") == [tiny_spm.token_to_id["ab"]]
    # add_space_prefix: a '▁' before the text and after each special token, never after plain text
    assert tiny_spm_prefixed.pieces(tiny_spm_prefixed.encode("ab<eos>ab", special=True)) == ["▁ab", "<eos>", "▁ab"]
    assert tiny_spm_prefixed.pieces(tiny_spm_prefixed.encode("ab<eos>ab")) == ["▁ab", "<0x3C>", "<0x65>", "<0x6F>",
                                                                              "<0x73>", "<0x3E>", "ab"]
    # no leading space is stripped on decode (see Tokenizer.token_bytes): the stream must equal the decode
    assert tiny_spm_prefixed.decode(tiny_spm_prefixed.encode("ab")) == " ab"


@settings(max_examples=200, deadline=None)
@given(text=st.lists(st.sampled_from(["a", "b", "c", " ", "é", "€", "d", "\n", "\n\n", "<b>", "<eos>", "😀"]),
                     max_size=20).map("".join))
def test_round_trip_and_the_stream_equals_the_decode(tiny_spm, text):
    ids = tiny_spm.encode(text, special=True)
    assert tiny_spm.decode(ids) == text
    detok = IncrementalDetokenizer(tiny_spm, skip_special=False)
    streamed = ""
    for token_id in ids:
        detok.add_token(token_id)
        streamed += detok.take_delta()
    assert streamed + detok.take_delta(final=True) == tiny_spm.decode(ids)


def test_a_sentencepiece_file_without_scores_is_refused():
    with pytest.raises(ModelFileError, match="one score per token") as info:
        Tokenizer(["a", "b"], [1, 1], model="llama")
    assert "\n" not in str(info.value)


# ---- Gemma 3 270M: the same ids as llama.cpp


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_model_path):
    return load_tokenizer(gemma_model_path)


def test_gemma_fixture_matches_llamacpp(gemma_tokenizer):
    rows = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert len(rows) >= 400 and any(r["special"] for r in rows)
    controls = [r for r in rows if r["special"] and set(r["ids"]) & gemma_tokenizer.control_ids]
    assert len(controls) >= 10                         # the control tokens are in it, matched whole
    bad = mismatches(gemma_tokenizer, rows)
    assert not bad, f"{len(bad)} of {len(rows)} strings differ from llama.cpp; first ones:\n" + "\n".join(bad[:5])


def test_gemma_metadata_and_round_trip(gemma_tokenizer):
    tok = gemma_tokenizer
    assert tok.vocab_size == 262144 and tok.add_bos and tok.bos_id == 2 and tok.eos_id == 1
    assert not tok.spm.add_space_prefix                 # Gemma 3's file says so: "Hello" is not "▁Hello"
    assert tok.pieces(tok.encode("Hello world")) == ["Hello", "▁world"]
    assert tok.token_types[tok.token_to_id["</s>"]] == CONTROL      # user-defined in the file, control to llama.cpp
    text = "Grüße, 世界! 😀\n\n\tcode()  x"
    assert tok.decode(tok.encode(text)) == text


@pytest.mark.peers
def test_gemma_live_against_llamacpp(gemma_tokenizer, gemma_model_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (the `peers` extra)")
    llm = llama_cpp.Llama(model_path=str(gemma_model_path), vocab_only=True, verbose=False)
    rng = random.Random()  # fresh strings on every run; the seed is in the failure message
    seed = rng.randrange(2**32)
    rng.seed(seed)
    specials = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "</s>", "<table>", "\n\n", "  ", "\t\t"]
    rows = live_rows(llm, rng, [" ", "\n", "a", "The"] * 20 + specials * 3)
    bad = mismatches(gemma_tokenizer, rows)
    assert not bad, f"seed {seed}: {len(bad)} of {len(rows)} differ from llama.cpp:\n" + "\n".join(bad[:5])

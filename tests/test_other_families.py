"""Qwen2, Llama 3 and Qwen3 through the one forward pass, against HF transformers float32 on tiny random-weight models
that llama.cpp's own converter (convert_hf_to_gguf.py, from the llama-cpp-python sdist) wrote to GGUF.

scripts/make_family_references.py builds the three models, converts them and writes HF's logits on 80 fixed token
ids; it runs once per session in the peers' HF Python (peer_cache.hf_python: $MINITRANSFORMER_HF_PYTHON or the
hf-venv of `python scripts/setup_peers.py hf`). Without the sdist or that Python every test here is skipped, saying
which is missing. Each family also gets a control: the one thing it adds to llama's forward (biases, frequency
factors, q/k norms) taken away must move the logits far past the tolerance, so the comparison can fail.
Tokenizers are out of scope: the files carry a tiny SentencePiece vocabulary only so that they load.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import test_tensor_parallel as tp
from minitransformer import SamplingParams, generate, load_model
from minitransformer.bench.peer_cache import converter_missing, hf_python, llama_converter
from minitransformer.core.errors import ModelFileError
from minitransformer.core.layers import rope_table
from minitransformer.core.rope import RopeTable
from minitransformer.serving import Engine
from test_reference import REL_TOL
from tiny_model import DIMS, write_tiny_llama

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "make_family_references.py"
FAMILIES = ("qwen2", "llama3", "qwen3")
IMPORTS = "import torch, transformers, sentencepiece"
process_tag = tp.process_tag        # the fixture that checks no MPI rank outlives its test


@pytest.fixture(scope="module")
def family_dir(tmp_path_factory):
    """The three GGUF files and HF references, made once per session (about a minute on 2 cores)."""
    missing = converter_missing()
    if missing:
        pytest.skip(missing)
    check = subprocess.run([hf_python(), "-c", IMPORTS], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip(f"{hf_python()} cannot `{IMPORTS}`: {check.stderr.strip().splitlines()[-1:]}; "
                    "make the HF venv with `python scripts/setup_peers.py hf`")
    out = tmp_path_factory.mktemp("families")
    done = subprocess.run([hf_python(), SCRIPT, out, "--converter", llama_converter()], capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def reference(family_dir: Path, family: str):
    ref = json.loads((family_dir / f"{family}.json").read_text())
    return np.array(ref["ids"])[None], np.array(ref["logits"], dtype=np.float32), ref["meta"]      # (1, T), (T, V)


def relative_error(model, ids, expected) -> float:
    """max over positions of max|ours - HF| / max|HF| at that position (the SmolLM2 reference's measure)."""
    logits = model.forward(ids, np.arange(ids.shape[1])[None])[0]                                   # (T, V)
    assert logits.dtype == np.float32 and logits.shape == expected.shape
    return float((np.abs(logits - expected).max(axis=1) / np.abs(expected).max(axis=1)).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf_float32(family_dir, family):
    ids, expected, meta = reference(family_dir, family)
    assert meta["dtype"] == "float32"
    model = load_model(family_dir / f"{family}.gguf")
    rel = relative_error(model, ids, expected)
    assert rel <= REL_TOL, f"{family}: relative difference {rel:.2e}"
    logits = model.forward(ids, np.arange(ids.shape[1])[None])[0]
    np.testing.assert_array_equal(logits.argmax(axis=1), expected.argmax(axis=1))


def test_the_converter_wrote_what_each_family_adds(family_dir):
    """The files are what the names say: Qwen2 neox with q|k|v biases and an untied lm_head, Llama 3 interleaved with
    frequency factors of all three kinds (1, the factor 8, interpolated), Qwen3 neox with q/k norms and a head_dim
    (32) that is not d_model / heads (16)."""
    qwen2, llama3, qwen3 = (load_model(family_dir / f"{f}.gguf").config for f in FAMILIES)
    assert (qwen2.rope_pairing, qwen2.qkv_bias, qwen2.tied_embeddings, qwen2.qk_norm) == ("neox", True, False, False)
    assert (llama3.rope_pairing, llama3.qkv_bias, llama3.qk_norm) == ("interleaved", False, False)
    factors = np.array(llama3.rope_freq_factors)
    assert factors.shape == (llama3.head_dim // 2,) and factors[0] == 1.0 and factors[-1] == 8.0
    assert ((factors > 1.0) & (factors < 8.0)).any()
    assert (qwen3.rope_pairing, qwen3.qk_norm, qwen3.qkv_bias, qwen3.head_dim) == ("neox", True, False, 32)
    assert qwen3.d_model // qwen3.n_heads == 16


def without(family: str, model):
    """`model` with the one thing `family` adds to llama's forward taken out."""
    if family == "qwen2":
        for layer in model.layers:
            layer.b_qkv = None
    elif family == "llama3":
        model.rope = RopeTable(dataclasses.replace(model.config, rope_freq_factors=()), model.xp)
    else:
        for layer in model.layers:
            layer.attn_q_norm = layer.attn_k_norm = None
    return model


@pytest.mark.parametrize("family", FAMILIES)
def test_what_the_family_adds_matters(family_dir, family):
    """The control: without its biases / frequency factors / q/k norms the same file is far off HF, so the match
    above is the feature's, not a comparison too loose to notice it."""
    ids, expected, _ = reference(family_dir, family)
    rel = relative_error(without(family, load_model(family_dir / f"{family}.gguf")), ids, expected)
    assert rel > 1000 * REL_TOL, f"{family}: only {rel:.2e} off without its feature"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_engine_gives_each_request_the_tokens_of_generate(family_dir, family):
    """The paged engine runs the same forward (its cache is the only difference): 4 concurrent greedy requests of
    different lengths, chunked prefill beside decodes, each with the tokens generate() gives it alone."""
    model = load_model(family_dir / f"{family}.gguf")
    engine = Engine(model, max_num_seqs=4, num_blocks=32, block_size=4, max_num_batched_tokens=16)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(1)
    prompts = [[int(t) for t in rng.integers(3, model.config.vocab_size, n)] for n in (3, 9, 17, 30)]
    ids = {engine.add_request(prompt, params): prompt for prompt in prompts}
    results = engine.run()
    for rid, prompt in ids.items():
        assert results[rid].token_ids == generate(model, prompt, params).token_ids, (family, len(prompt))


@tp.needs_mpi
@pytest.mark.usefixtures("process_tag")
@pytest.mark.parametrize("size,local,kv_share", [(2, [2, 1, 64], 1 / 2), (4, [1, 1, 32], 1 / 2)])
def test_qwen2_split_over_ranks_gives_the_logits_and_tokens_of_one_process(family_dir, size, local, kv_share):
    """Tensor parallelism cuts the q|k|v bias with its columns: each rank adds its own heads' part (at 4 ranks each
    of the 2 KV heads, and so its bias, is held by two ranks)."""
    tp.check_sharded_run(tp.mpiexec(size, "forward", str(family_dir / "qwen2.gguf"), "6"), size, local, kv_share)


# ---- without the converter: the factors' arithmetic, and what the forward refuses ------------------------------

def test_frequency_factors_divide_each_pairs_angle():
    """Factor 2 on every pair turns position 2p by what plain RoPE turns p; factor 1 changes nothing."""
    plain_cos, plain_sin = rope_table(16, 8, 10000.0)
    cos, sin = rope_table(16, 8, 10000.0, (2.0, 2.0, 2.0, 2.0))
    np.testing.assert_allclose(cos[::2], plain_cos[:8], atol=1e-6)
    np.testing.assert_allclose(sin[::2], plain_sin[:8], atol=1e-6)
    np.testing.assert_array_equal(rope_table(16, 8, 10000.0, (1.0,) * 4)[0], plain_cos)


def test_a_file_with_rope_freqs_loads_its_factors_into_the_rope_table(tmp_path):
    factors = np.geomspace(1.0, 8.0, DIMS["head_dim"] // 2).astype(np.float32)          # (d/2,)
    model = load_model(write_tiny_llama(tmp_path / "l3.gguf", extra={"rope_freqs.weight": factors}))
    assert model.config.rope_freq_factors == tuple(factors.tolist())
    cos, _ = rope_table(model.rope.positions, model.config.head_dim, model.config.rope_base, factors)
    np.testing.assert_array_equal(model.rope_cos, cos)


@pytest.mark.parametrize("arch,metadata,extra,message", [
    ("llama", {"llama.rope.scaling.type": "linear"}, {}, "RoPE scaling 'linear'"),
    ("qwen2", {"qwen2.attention.sliding_window": 4096}, {}, "sliding-window layers"),
    ("llama", {}, {"rope_freqs.weight": np.ones(3, dtype=np.float32)}, "rope_freqs.weight must be"),
    ("llama", {}, {"rope_freqs.weight": -np.ones(DIMS["head_dim"] // 2, dtype=np.float32)}, "positive"),
])
def test_what_the_forward_does_not_apply_is_refused_in_one_line(tmp_path, arch, metadata, extra, message):
    path = write_tiny_llama(tmp_path / "m.gguf", arch=arch, metadata=metadata, extra=extra)
    with pytest.raises(ModelFileError, match=message):
        load_model(path)

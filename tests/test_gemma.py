"""Gemma 3 270M through the one forward pass: its config read from the GGUF, its logits against HF transformers'
Gemma3ForCausalLM in float32 (fixture from scripts/make_gemma_reference.py) on prompts of 16, 600 and 1,100 tokens,
greedy generation through generate(), the paged engine (8 requests at once) and the server. The sliding window's mask
is also checked on small random arrays against attention written out with the full mask."""

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from openai import OpenAI

from minitransformer import SamplingParams, generate, load_model
from minitransformer.core.errors import InputError
from minitransformer.core.layers import attention, causal_attention
from minitransformer.core.model import LAYER_WEIGHTS, layer_weights
from minitransformer.no_cache import RecomputeRunner
from minitransformer.serving import Engine
from minitransformer.speculative import speculative_runner
from server_process import running_server
from test_reference import REL_TOL

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "gemma_reference.json").read_text())
CASES = FIXTURE["cases"]


@pytest.fixture(scope="module")
def gemma(gemma_model_path):
    return load_model(gemma_model_path)


def test_fixture_covers_what_the_issue_asks():
    assert sorted(len(c["ids"]) for c in CASES) == [16, 600, 1100]
    assert FIXTURE["meta"]["dtype"] == "float32" and FIXTURE["meta"]["sliding_window"] == 512
    assert all(c["ids"][0] == 2 and len(c["greedy"]) >= 16 for c in CASES)          # BOS first


def test_the_config_says_what_gemma3_is(gemma):
    c = gemma.config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim) == (18, 640, 4, 1, 256, 2048)
    assert c.rope_pairing == "neox" and c.activation == "gelu_tanh" and c.qk_norm and c.sandwich_norms
    assert c.embedding_scale == pytest.approx(640 ** 0.5) and c.attention_scale == 1 / 16
    assert (c.rope_base, c.rope_base_local, c.sliding_window) == (1e6, 1e4, 512)
    assert [i for i in range(18) if i not in c.sliding_layers] == [5, 11, 17]             # every 6th is global
    assert ["global" if i not in c.sliding_layers else "local" for i in range(18)] == [
        "global" if t == "full_attention" else "local" for t in FIXTURE["meta"]["layer_types"]]   # HF's layer types
    assert [w.field for w in LAYER_WEIGHTS if w not in layer_weights(c)] == ["b_qkv"]   # all but Qwen2's bias
    assert gemma.layers[0].attn_q_norm.shape == (256,) and gemma.layers[0].post_ffw_norm.shape == (640,)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_logits_match_hf_float32(gemma, case):
    """The last position's top-5 logits within the SmolLM2 reference's tolerance: max|diff| / max|ref| <= 1e-4."""
    ids = np.array(case["ids"])[None]
    logits = gemma.forward(ids, np.arange(ids.shape[1])[None], last_only=True)[0]       # (V,)
    assert logits.dtype == np.float32
    ours = logits[case["top_ids"]]
    rel = np.abs(ours - np.array(case["top_logits"], dtype=np.float32)).max() / case["max_abs"]
    assert rel <= REL_TOL, f"relative difference {rel:.2e}"
    assert np.abs(logits).max() == pytest.approx(case["max_abs"], rel=REL_TOL)
    assert int(logits.argmax()) == case["top_ids"][0]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_greedy_tokens_match_hf(gemma, case):
    """Through the cached loop (prefill, contiguous KV cache with the window as a mask, decode), past EOS."""
    params = SamplingParams(max_tokens=len(case["greedy"]), temperature=0.0, ignore_eos=True)
    assert generate(gemma, case["ids"], params).token_ids == case["greedy"]


@pytest.mark.slow
@pytest.mark.parametrize("how, tokens", [({"runner": RecomputeRunner}, 4),
                                         ({"runner": speculative_runner("ngram")}, 16),
                                         ({"runner": speculative_runner("self:9")}, 16)],
                         ids=["no_cache", "ngram", "self"])
def test_the_other_contiguous_paths_give_the_same_tokens(gemma, how, tokens):
    """The no-cache baseline and speculative decoding (whose verify passes and rollbacks use the contiguous cache)
    past the window: the 600-token prompt's greedy ids. The baseline keeps nothing from one step to the next (each
    step is the whole sequence again, every one past the 512-token window), so its first 4 tokens check what all 16
    would, at a quarter of its cost (16 full passes of ~600 tokens took ~50 s)."""
    case = next(c for c in CASES if len(c["ids"]) == 600)
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    assert generate(gemma, case["ids"], params, **how).token_ids == case["greedy"][:tokens]


def test_a_text_prompt_gets_bos_first(gemma):
    """The file asks for BOS (tokenizer.ggml.add_bos_token): a text prompt starts with id 2, as HF's would."""
    result = generate(gemma, "The capital of France is", SamplingParams(max_tokens=1, temperature=0.0))
    assert result.prompt_token_ids[0] == 2 and result.prompt_token_ids[1:] == gemma.tokenizer.encode(
        "The capital of France is")


@pytest.mark.slow
def test_the_paged_engine_gives_hf_greedy_tokens_for_8_concurrent_requests(gemma):
    """The paged pool keeps a sliding layer's old blocks and masks them (SlidingWindowAttention): 8 requests at once,
    prefilled in chunks of 256 tokens (so chunks past the window attend to a cached prefix through it) and decoded
    in groups of similar length, give the fixture's HF greedy ids for its three prompts and generate()'s (the
    contiguous cache, held to HF above) for five cuts of them on both sides of the 512-token window."""
    by_length = {len(c["ids"]): c for c in CASES}
    long_ids = by_length[1100]["ids"]
    cuts = [long_ids[:n] for n in (40, 300, 511, 530, 700)]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    solo = [generate(gemma, ids, params).token_ids for ids in cuts]
    engine = Engine(gemma, max_num_seqs=8, max_num_batched_tokens=256, enable_prefix_caching=False)
    prompts = [c["ids"] for c in CASES] + cuts
    ids = [engine.add_request(p, params) for p in prompts]
    results = {rid: r.token_ids for rid, r in engine.run().items()}
    expected = [c["greedy"][:12] for c in CASES] + solo
    assert [results[i] for i in ids] == expected
    assert engine.stats.kv_cache_usage == 0.0                                    # every block back in the pool


def test_serve_by_name_answers_with_generates_greedy_text(gemma):
    """`serve --model gemma3-270m` (the name, as a user types it): two concurrent completions through the official
    client equal generate()'s greedy text, BOS added by the server's tokenization as by generate()'s."""
    prompts = ["The capital of France is", "Water boils at"]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    expected = [generate(gemma, p, params).text for p in prompts]
    with running_server("--model", "gemma3-270m", "--num-blocks", "64", "--log-level", "warning") as server:
        client = OpenAI(base_url=server.url + "/v1", api_key="none")
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda p: client.completions.create(
                model=client.models.list().data[0].id, prompt=p, max_tokens=16, temperature=0.0,
                extra_body={"ignore_eos": True}), prompts))
    assert [a.choices[0].text for a in answers] == expected


def test_cuda_graphs_are_refused_for_sliding_layers_on_a_gpu(gemma, monkeypatch):
    """Graph capture would replay the arrays' gathers; on the CPU the static-buffer step runs uncaptured (allowed)."""
    monkeypatch.setattr(gemma, "device", "gpu")
    with pytest.raises(InputError, match="CUDA graphs do not capture sliding-window layers"):
        Engine(gemma, num_blocks=8, cuda_graphs=True)


@pytest.mark.parametrize("T, S, window", [(1, 40, 8), (1, 5, 8), (37, 37, 8), (200, 200, 50), (90, 150, 64),
                                          (130, 130, 1)])
def test_causal_attention_with_a_window_equals_the_full_mask(T, S, window):
    """Blocks and the decode slice skip keys out of the window: the same numbers as the whole masked product."""
    rng = np.random.default_rng(T * S + window)
    q = rng.standard_normal((1, 4, T, 16), dtype=np.float32)
    k, v = (rng.standard_normal((1, 2, S, 16), dtype=np.float32) for _ in range(2))
    k_pos = np.arange(S)[None]
    q_pos = k_pos[:, S - T:]
    out = causal_attention(q, k, v, q_pos, k_pos, block=32, window=window)
    scores = np.einsum("hgtd,hsd->hgts", q[0].reshape(2, 2, T, 16), k[0]) / 4.0           # (K, G, T, S)
    visible = (k_pos[0][None] <= q_pos[0][:, None]) & (k_pos[0][None] > q_pos[0][:, None] - window)   # (T, S)
    scores = np.where(visible, scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    expected = np.einsum("hgts,hsd->hgtd", probs / probs.sum(-1, keepdims=True), v[0]).reshape(1, 4, T, 16)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
    if window >= S:                                     # a window as long as the sequence is no window at all
        np.testing.assert_allclose(out, attention(q, k, v, q_pos, k_pos), rtol=1e-5, atol=1e-6)

"""Notebooks 01-04 execute from a fresh kernel on the real model, and the values they print hold up.

Each notebook asserts its own checks as it runs (an assert failing is a cell error, which fails execution here).
On top of that we read each notebook's final JSON summary line and compare it with references computed in this
file, independently of the notebook's code path: attention weights, RoPE and RMSNorm redone in float64 from the
raw weights, next-token probabilities from a plain forward pass, greedy tokens checked by teacher forcing, cache
sizes from the model's architecture facts (README.md, "The default model"), filter sizes from sorting, stop points
and streamed deltas from decoding token prefixes, metrics from the raw timestamps. The committed copies must carry
their outputs and stay small.
Executing all four costs about 70 s of CPU (13-22 s each, measured by scripts/make_notebooks.py, which rebuilds
them); on a 2-core machine shared with other jobs the wall time was 4-5 minutes.
"""

from __future__ import annotations

import numpy as np
import pytest

from notebook_runner import NOTEBOOKS, execute_notebook, summary

nbformat = pytest.importorskip("nbformat")
NAMES = {"01": "01_tokenize_and_prefill", "02": "02_kv_cache_and_decode", "03": "03_sampling_and_stopping",
         "04": "04_streaming_and_metrics"}
IMAGES = {"01": 3, "02": 1, "03": 1, "04": 1}

# SmolLM2-135M's architecture (README.md, "The default model"), used as independent constants.
LAYERS, KV_HEADS, HEAD_DIM, HEADS, EPS, ROPE_BASE = 30, 3, 64, 9, 1e-5, 100000.0
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4            # K and V, float32: 46,080


@pytest.fixture(scope="module")
def run(real_model_path):
    """run("01") -> the summary of notebook 01 executed now from a fresh kernel (once per test module)."""
    _executed: dict[str, dict] = {}

    def execute(key: str) -> dict:
        if key not in _executed:
            nb = execute_notebook(NOTEBOOKS / f"{NAMES[key]}.ipynb", real_model_path)
            images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
                      if "image/png" in o.get("data", {})]
            assert len(images) == IMAGES[key], f"notebook {key}: {len(images)} figures"
            _executed[key] = summary(nb)
        return _executed[key]
    return execute


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def _last_logits(model, ids) -> np.ndarray:
    """The next-token logits of a whole sequence in one plain forward pass (no cache), as float64."""
    return model.forward(np.array([ids]), np.arange(len(ids))[None])[0].astype(np.float64)   # (T, V)


def _check_greedy(model, prompt_ids, tokens):
    """Greedy tokens by teacher forcing: every token is the argmax after the prompt and the tokens before it."""
    logits = _last_logits(model, list(prompt_ids) + list(tokens[:-1]))
    assert [int(t) for t in logits[len(prompt_ids) - 1:].argmax(-1)] == list(tokens)


# ---------------------------------------------------------------------------------------------------- 01

def test_01_tokens_embeddings_attention_and_next_token(run, real_model):
    s = run("01")
    tok, cfg = real_model.tokenizer, real_model.config
    assert (cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.n_heads) == (LAYERS, KV_HEADS, HEAD_DIM, HEADS)
    ids = s["ids"]
    assert ids == tok.encode(s["prompt"]) and tok.decode(ids) == s["prompt"] and s["pieces"] == tok.pieces(ids)
    emb = real_model.embedding[ids].astype(np.float64)                   # (T, D)
    np.testing.assert_allclose(s["embedding_norms"], np.linalg.norm(emb, axis=1), rtol=1e-5)

    # Layer 0, the notebook's head, last query: RMSNorm, projections, adjacent-pair RoPE, causal softmax, in float64.
    layer = real_model.layers[0]
    x = emb / np.sqrt((emb ** 2).mean(-1, keepdims=True) + EPS) * layer.attn_norm
    T, h = len(ids), s["head"]
    q = (x @ layer.wq.astype(np.float64)).reshape(T, HEADS, HEAD_DIM)[:, h]                  # (T, d)
    k = (x @ layer.wk.astype(np.float64)).reshape(T, KV_HEADS, HEAD_DIM)[:, h // (HEADS // KV_HEADS)]
    angle = np.arange(T)[:, None] * ROPE_BASE ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)     # (T, d/2)

    def rope(a):
        even, odd = a[:, 0::2], a[:, 1::2]
        out = np.empty_like(a)
        out[:, 0::2] = even * np.cos(angle) - odd * np.sin(angle)
        out[:, 1::2] = even * np.sin(angle) + odd * np.cos(angle)
        return out
    weights = _softmax(rope(q)[-1] @ rope(k).T / np.sqrt(HEAD_DIM))                          # last query sees all
    np.testing.assert_allclose(s["attn_last_row"], weights, atol=1e-4)
    assert s["attn_row_sum_err"] < 1e-5 and s["attn_upper_max"] == 0

    assert s["k_model_diff"] < 1e-4 and s["qkv_split_diff"] < 1e-4 and s["block_diff"] < 1e-5
    assert s["rope_pos0_diff"] == 0 and s["rope_norm_diff"] < 1e-4 and s["rope_relative_diff"] < 1e-3
    assert s["hand_vs_prefill"] < 1e-3 and s["cache_length"] == T

    p = _softmax(_last_logits(real_model, ids)[-1])
    top = np.argsort(-p, kind="stable")[:10]
    assert s["top_ids"] == top.tolist()
    np.testing.assert_allclose(s["top_probs"], p[top], atol=1e-5)
    assert abs(s["prob_sum"] - 1) < 1e-5


# ---------------------------------------------------------------------------------------------------- 02

def test_02_cache_grows_one_token_per_step_and_matches_recomputation(run, real_model):
    s = run("02")
    prompt_ids = real_model.tokenizer.encode(s["prompt"])
    T, N = s["T"], s["N"]
    assert T == len(prompt_ids) and N >= 4
    assert s["lengths"] == list(range(T, T + N + 1))
    assert s["bytes_used"] == [KV_BYTES_PER_TOKEN * n for n in s["lengths"]]
    assert s["bytes_reserved"] == s["kv_cache_bytes"] == KV_BYTES_PER_TOKEN * (T + N)
    assert s["cache_k_shape"] == [LAYERS, 1, T + N, KV_HEADS, HEAD_DIM] and s["kv_cache_tokens"] == T + N
    assert s["unfilled_max"] == 0
    assert s["key_diff"] < 1e-4 and s["value_diff"] < 1e-4 and s["logits_diff"] < 1e-3
    assert len(s["tokens"]) == N + 1 and s["generate_tokens"] == s["tokens"]
    _check_greedy(real_model, prompt_ids, s["tokens"])


# ---------------------------------------------------------------------------------------------------- 03

def _kept_by_sorting(logits, temperature=1.0, top_k=None, top_p=None, min_p=None) -> int:
    p = _softmax(logits / temperature)
    if min_p is not None:
        return int((p >= min_p * p.max()).sum())
    ranked = np.sort(p)[::-1][:top_k]
    if top_p is None:
        return len(ranked)
    return int(np.searchsorted(np.cumsum(ranked / ranked.sum()), top_p) + 1)   # smallest prefix reaching top_p


def test_03_sampler_filters_and_stop_rules(run, real_model):
    s = run("03")
    tok = real_model.tokenizer
    ids = tok.encode(s["prompt"])
    logits = _last_logits(real_model, ids)[-1]                          # (V,)
    p = _softmax(logits)
    top = np.argsort(-p, kind="stable")
    assert s["top_ids"] == top[:10].tolist()
    np.testing.assert_allclose(s["top_probs"], p[top[:10]], atol=1e-5)

    entropy = {t: float(-(q * np.log(np.maximum(q, 1e-300))).sum()) for t in (0.5, 1.0, 1.5)
               for q in [_softmax(logits / t)]}
    assert s["temperature_entropy"]["0.0"] == 0
    for t, e in entropy.items():
        assert abs(s["temperature_entropy"][str(t)] - e) < 1e-3, t

    assert s["kept"] == {"min_p=0.1": _kept_by_sorting(logits, min_p=0.1), "top_k=5": 5,
                         "top_p=0.9": _kept_by_sorting(logits, top_p=0.9),
                         "T=0.7, top_k=50, top_p=0.8": _kept_by_sorting(logits, 0.7, top_k=50, top_p=0.8)}
    assert sorted(s["kept_ids"]["top_k=5"]) == sorted(top[:5].tolist())
    assert set(s["seeded_draws"]) <= set(top[:8].tolist()) and s["freq_diff"] < 0.05

    # Stop rules on the greedy output: the stop points found by decoding token prefixes.
    greedy = s["greedy_ids"]
    _check_greedy(real_model, tok.encode(s["stop_prompt"]), greedy)
    texts = [tok.decode(greedy[:n]) for n in range(len(greedy) + 1)]
    n_stop = next(n for n, text in enumerate(texts) if "answer is" in text)
    newline = tok.encode("\n")[0]
    expected = {"stop=['answer is']": (n_stop, "stop", "answer is", texts[n_stop][:texts[n_stop].find("answer is")]),
                "stop_token_ids=[newline]": (greedy.index(newline) + 1, "stop", newline, None),
                "same, min_tokens=4": (greedy.index(newline, 3) + 1, "stop", newline, None),
                "max_tokens=3": (3, "length", None, texts[3]),
                "EOS as the 3rd token": (3, "stop", "eos", texts[2]),
                "same, ignore_eos": (3, "length", None, texts[2])}
    for name, (n, finish, reason, text) in expected.items():
        got = s["stops"][name]
        assert (got["tokens"], got["finish_reason"], got["stop_reason"]) == (n, finish, reason), name
        assert got["text"] == (text if text is not None else texts[n - 1]), name   # a stop token's text is cut
    assert s["generate_stop"] == s["stops"]["stop=['answer is']"]


# ---------------------------------------------------------------------------------------------------- 04

def test_04_partial_characters_are_held_back(run, real_model):
    s = run("04")["partial"]
    tok = real_model.tokenizer
    assert s["ids"] == tok.encode(s["text"])
    shown = [b"".join(tok.token_bytes(t) for t in s["ids"][:n]).decode("utf-8", errors="ignore")
             for n in range(len(s["ids"]) + 1)]                        # complete characters only
    assert s["deltas"] == [shown[n + 1][len(shown[n]):] for n in range(len(s["ids"]))]
    assert "".join(s["deltas"]) + s["final"] == s["text"] and "" in s["deltas"]


def test_04_stream_holds_back_stop_prefixes_and_adds_up(run, real_model):
    s = run("04")
    tok = real_model.tokenizer
    (stop,) = s["stop"]
    greedy = s["greedy_ids"]
    _check_greedy(real_model, tok.encode(s["prompt"]), greedy)
    texts = [tok.decode(greedy[:n]) for n in range(len(greedy) + 1)]
    n_stop = next(n for n, text in enumerate(texts) if stop in text)
    final_text = texts[n_stop][:texts[n_stop].find(stop)]
    # Streamed up to each step: everything but the longest tail that is a proper prefix of the stop string.
    held = [max([j for j in range(1, len(stop)) if text.endswith(stop[:j])] or [0]) for text in texts[1:n_stop]]
    sent = [text[:len(text) - h] for text, h in zip(texts[1:n_stop], held)]
    expected = [b[len(a):] for a, b in zip([""] + sent, sent)] + [final_text[len(sent[-1]):]]
    assert s["walk"]["held"] == held + [0] and max(held) > 0
    assert s["stream_texts"] == s["walk"]["deltas"] == expected
    assert "".join(s["stream_texts"]) == s["result"]["text"] == final_text
    assert s["result"] == {"text": final_text, "token_ids": greedy[:n_stop], "finish_reason": "stop",
                           "stop_reason": stop}


def test_04_metrics_follow_from_the_timestamps(run):
    s = run("04")
    t, m = s["timestamps"], s["metrics"]
    times = t["tokens"]
    n = len(times)
    assert t["arrival"] <= t["scheduled"] <= times[0] and times == sorted(times) and times[-1] <= t["finished"]
    assert s["usage"] == {"prompt_tokens": s["usage"]["prompt_tokens"], "completion_tokens": n,
                          "total_tokens": s["usage"]["prompt_tokens"] + n}
    ttft, e2e = times[0] - t["arrival"], t["finished"] - t["arrival"]
    gaps = np.diff(times)
    expected = {"queue_s": t["scheduled"] - t["arrival"], "prefill_s": times[0] - t["scheduled"], "ttft_s": ttft,
                "tpot_s": (e2e - ttft) / (n - 1), "decode_tokens_per_s": (n - 1) / (e2e - ttft), "e2e_s": e2e}
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    p50, p90, p99 = np.percentile(gaps, [50, 90, 99])
    assert m["itl_s"] == pytest.approx({"mean": gaps.mean(), "p50": p50, "p90": p90, "p99": p99}, rel=1e-9)


# ---------------------------------------------------------------------------------------------------- committed

@pytest.mark.parametrize("key", NAMES)
def test_committed_copy_has_outputs_and_is_small(key):
    path = NOTEBOOKS / f"{NAMES[key]}.ipynb"
    assert path.stat().st_size < 300_000
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code), "commit the notebook executed (with its outputs): scripts/make_notebooks.py"
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
    assert "sys.path.insert" in code[0].source                          # runs from a checkout without installing
    assert summary(nb)                                                 # the committed run finished

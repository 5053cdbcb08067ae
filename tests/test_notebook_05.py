"""Notebook 05 executes from a fresh kernel on the real model, and what it measures holds together.

The notebook asserts paged == contiguous attention and engine == generate() tokens inside itself; here we read its
final summary line and check it against references computed independently: the pools' shape from the model config,
the block bytes from the KV formula, the step's token counts from the prompts and max_tokens, and the greedy tokens
from generate() run here. We also check the committed copy: it carries its outputs and a figure, and stays small.
"""

from __future__ import annotations

import pytest

from minitransformer import SamplingParams, generate
from notebook_runner import NOTEBOOKS, execute_notebook, summary

nbformat = pytest.importorskip("nbformat")

NOTEBOOK = NOTEBOOKS / "05_batching_and_paged_attention.ipynb"



@pytest.fixture(scope="module")
def executed(real_model_path):
    return execute_notebook(NOTEBOOK, real_model_path)


def test_pools_and_blocks_have_the_model_shapes(executed, real_model):
    s, cfg = summary(executed), real_model.config
    assert s["pool_shape"] == [cfg.n_layers, s["num_blocks"], s["block_size"], cfg.n_kv_heads, cfg.head_dim]
    assert s["bytes_per_block"] == 2 * cfg.n_layers * s["block_size"] * cfg.n_kv_heads * cfg.head_dim * 4
    assert s["free_at_end"] == s["num_blocks"]                        # every block came back
    assert s["paged_diff"] < 1e-5


def test_step_log_accounts_for_every_token(executed):
    s = summary(executed)
    # No prefix cache, no preemption: each prompt token is computed once, each output token after the first is a decode.
    assert s["prefill_tokens"] == sum(s["prompt_lens"].values())
    assert s["decode_tokens"] == sum(n - 1 for n in s["max_tokens"].values())
    assert s["max_batched"] <= 48 < max(s["prompt_lens"].values())    # the long prompt had to be chunked
    assert s["steps"] > s["prefill_tokens"] // 48


def test_engine_tokens_equal_generate_alone(executed, real_model):
    s = summary(executed)
    text = ("Paged attention stores the keys and values of every sequence in fixed-size blocks, so memory is handed "
            "out as a sequence grows instead of reserved for its longest possible length. ") * 3
    ids = real_model.tokenizer.encode(text)
    prompts = {"a": ids[:12], "b": ids[5:35], "c": ids[10:80]}
    assert s["prompt_lens"] == {rid: len(p) for rid, p in prompts.items()}
    for rid, prompt in prompts.items():
        alone = generate(real_model, prompt, SamplingParams(max_tokens=s["max_tokens"][rid], temperature=0.0,
                                                            ignore_eos=True))
        assert s["tokens"][rid] == alone.token_ids, rid


def test_committed_copy_has_outputs_and_is_small():
    assert NOTEBOOK.stat().st_size < 300_000
    committed = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code), "commit the notebook executed (with its outputs)"
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1
    assert summary(committed)["paged_diff"] < 1e-5

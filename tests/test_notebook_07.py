"""Notebook 07 executes from a fresh kernel on the real model, and the verify passes it shows hold together.

References computed here: plain greedy decoding of the same prompt (generate, no speculation) decides which drafts
had to be accepted, and the cache lengths follow from the counts (each pass writes 1 + k slots; the roll back
keeps the prompt plus the tokens emitted before the correction). For the sampled case, the target's distribution p
from a full forward pass and a softmax written here, and the TV bound's formula written out.
"""

from __future__ import annotations

import numpy as np
import pytest

from minitransformer import SamplingParams, generate
from notebook_runner import NOTEBOOKS, execute_notebook, summary

nbformat = pytest.importorskip("nbformat")

NOTEBOOK = NOTEBOOKS / "07_speculative_decoding.ipynb"
PROMPT = ("Here is a list of fruits: apple, banana, cherry, grape, lemon, mango, orange, peach, pear, plum.\n"
          "The same list again, comma-separated: apple, banana,")



@pytest.fixture(scope="module")
def executed(real_model_path):
    return execute_notebook(NOTEBOOK, real_model_path)


def test_verify_passes_accept_exactly_what_plain_greedy_decoding_produces(executed, real_model):
    s = summary(executed)
    plain = generate(real_model, PROMPT, SamplingParams(max_tokens=len(s["tokens"]), temperature=0.0)).token_ids
    assert s["tokens"] == plain and s["matches_plain"]
    position = 1                                           # tokens[0] came from the prefill
    for p in s["passes"]:
        truth = plain[position:position + len(p["drafts"])]
        expected = next((i for i, (d, t) in enumerate(zip(p["drafts"], truth)) if d != t), len(p["drafts"]))
        assert p["accepted"] == expected
        assert p["verified"] == s["prompt_tokens"] + position - 1           # every emitted token but the newest
        assert p["written"] == p["verified"] + 1 + len(p["drafts"])         # one pass: the token and its k drafts
        position += p["accepted"] + 1
    last = s["passes"][-1]
    assert last["accepted"] < len(last["drafts"])                           # the notebook shows a rejection
    assert s["cache_before_rollback"] == last["written"]
    assert s["cache_after_rollback"] == s["prompt_tokens"] + len(s["tokens"]) - 1
    assert s["cache_max_diff"] < 1e-4


def test_committed_copy_has_outputs_and_is_small():
    assert NOTEBOOK.stat().st_size < 300_000
    committed = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code), "commit the notebook executed (with its outputs)"
    assert summary(committed)["matches_plain"]
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 2                                                 # the rejection, the sampled draws


def test_sampled_case_keeps_the_targets_distribution(executed, real_model):
    """Speculative sampling's tokens are as close to p as plain draws (TV within the bound), keeping every draft
    would not be, the kept fraction is sum min(p, q), and p and q are the model's and its first layers'."""
    s = summary(executed)["sampled"]
    ids = real_model.tokenizer.encode(s["prompt"])
    logits = real_model.forward(np.asarray([ids]), np.arange(len(ids))[None], last_only=True)[0].astype(np.float64)
    p = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()        # temperature 1: plain softmax
    draft = real_model.forward(np.asarray([ids]), np.arange(len(ids))[None], layers=s["layers"],
                               last_only=True)[0].astype(np.float64)
    q = np.exp(draft - draft.max()) / np.exp(draft - draft.max()).sum()
    assert s["temperature"] == 1.0 and s["layers"] < real_model.config.n_layers
    assert s["overlap"] == pytest.approx(float(np.minimum(p, q).sum()), abs=1e-5)
    assert s["tv_draft"] == pytest.approx(0.5 * float(np.abs(p - q).sum()), abs=1e-5)
    n = s["draws"]
    bound = 0.5 * np.sqrt(p * (1 - p) / n).sum() + np.sqrt(np.log(1000) / (2 * n))     # E[TV] + McDiarmid margin
    assert n >= 1000 and s["bound"] == pytest.approx(bound, rel=1e-5)
    assert s["identity_diff"] < 1e-9
    assert s["tv_speculative"] <= s["bound"] and s["tv_plain"] <= s["bound"] < s["tv_draft"]
    assert abs(s["kept"] - s["overlap"]) <= 4 * np.sqrt(s["overlap"] * (1 - s["overlap"]) / n) + 0.002

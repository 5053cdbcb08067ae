"""Notebook 07 executes from a fresh kernel on the real model, and the verify passes it shows hold together.

References computed here: plain greedy decoding of the same prompt (generate, no speculation) decides which drafts
had to be accepted, and the cache lengths follow from the counts (each pass writes 1 + k slots; the roll back
keeps the prompt plus the tokens emitted before the correction).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minitransformer import SamplingParams, generate

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "07_speculative_decoding.ipynb"
PROMPT = ("Here is a list of fruits: apple, banana, cherry, grape, lemon, mango, orange, peach, pear, plum.\n"
          "The same list again, comma-separated: apple, banana,")


def _summary(nb) -> dict:
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    return json.loads(text.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def executed(real_model_path):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []                                          # nothing from the committed run survives
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINITRANSFORMER_MODEL", str(real_model_path))   # the notebook's kernel inherits it
        nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return nb


def test_verify_passes_accept_exactly_what_plain_greedy_decoding_produces(executed, real_model):
    s = _summary(executed)
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
    assert _summary(committed)["matches_plain"]
    images = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1

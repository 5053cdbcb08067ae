"""Notebook 06 executes from a fresh kernel on the real model, and what it measures holds together.

The notebook asserts kernel == array inside itself; here we also read its final summary line and check it against
references computed independently (the causal tile rule from the token count), and check the committed copy: it
carries its outputs, its figures, and stays small.
"""

from __future__ import annotations

import pytest

from notebook_runner import NOTEBOOKS, execute_notebook, summary

nbformat = pytest.importorskip("nbformat")

NOTEBOOK = NOTEBOOKS / "06_cuda_kernels.ipynb"


def _visited(Tq: int, Tk: int) -> int:
    """(16-row query tile, 32-key tile) pairs a causal kernel must load: keys 0 .. the tile's last position."""
    return sum(-(-(Tk - Tq + min(Tq, 16 * (i + 1))) // 32) for i in range(-(-Tq // 16)))



@pytest.fixture(scope="module")
def executed(real_model_path):
    return execute_notebook(NOTEBOOK, real_model_path)


def test_kernels_match_the_array_version(executed):
    s = summary(executed)
    assert s["layers"] == 30 and s["tokens"] > 64                      # the real model; several tiles each way
    for key in ("max_layer_diff", "chunk_diff", "mirror_out_diff", "mirror_lse_diff", "merge_diff", "decode_diff"):
        assert s[key] < 1e-5, (key, s[key])
    assert s["max_layer_diff"] > 0                                     # the kernel ran: other summation order
    assert s["gpu_diff"] is None or s["gpu_diff"] < 1e-5


def test_visited_tiles_follow_the_causal_rule(executed):
    s = summary(executed)
    T = s["tokens"]
    assert s["visited"] == {"whole prompt": _visited(T, T), "chunk of 40 after 36 cached": _visited(40, T)}
    assert s["tiles"]["whole prompt"] == -(-T // 16) * -(-T // 32)
    assert s["visited"]["whole prompt"] < s["tiles"]["whole prompt"]   # causal skipping happened


def test_tensor_core_kernel_stays_under_its_bound(executed):
    """flash_prefill_wmma.cu on every layer's q, k, v in float16: its own error (vs the array version on the same
    float16 inputs) under the bound of tests/test_flash_prefill_wmma.py; the work count recomputed here."""
    s = summary(executed)
    assert 0 < s["wmma_bound_ratio"] <= 1 and s["wmma_diff"] > 0
    assert s["wmma_mma_per_tile"] == 2 * 16 * 32 * 64 // (16 * 16 * 16)   # S and P V of 16 rows x 32 keys, d = 64


def test_figures_are_drawn(executed):
    images = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3                                            # two heatmaps, the tensor-core errors


def test_committed_copy_has_outputs_and_is_small():
    assert NOTEBOOK.stat().st_size < 300_000
    committed = nbformat.read(NOTEBOOK, as_version=4)
    code = [c for c in committed.cells if c.cell_type == "code"]
    assert all(c.outputs for c in code), "commit the notebook executed (with its outputs)"
    assert summary(committed)["max_layer_diff"] < 1e-5

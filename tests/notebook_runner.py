"""Execute a committed notebook from a fresh kernel, as the tests of notebooks 01-07 do, and read its summary.

Every code cell's saved outputs are dropped first, so nothing from the committed run can pass for this one; the
kernel runs in notebooks/ (as a reader's would) and finds the real model through MINITRANSFORMER_MODEL.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def execute_notebook(path: Path, model_path, timeout: int = 600):
    """Run every cell of `path` in a new python3 kernel -> the executed notebook (nbformat node)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []                                          # nothing from the committed run survives
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINITRANSFORMER_MODEL", str(model_path))       # the notebook's kernel inherits it
        nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def summary(nb) -> dict:
    """The JSON object a notebook prints as the last line of its last cell: the values the tests check."""
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    return json.loads(text.strip().splitlines()[-1])

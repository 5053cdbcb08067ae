"""Lesson 17 (what a model's shape costs) and its arithmetic, bench/model_shape.py and kv_cache's windowed bytes.

The arithmetic is checked on the tiny model against what the loaded and quantized arrays really hold. The lesson runs
as a learner runs it (a subprocess on SmolLM2-135M and Gemma 3 270M) and its printed numbers are checked against
references computed here: the parameters from the GGUF's own tensor sizes (gguf's reader), the KV bytes per token
from the file's metadata, the sliding layers from the config. Its claims() is run on its output and on edited copies:
a printed number changed to contradict a claim must flip it. No timing is asserted.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from minitransformer.bench.model_shape import (
    FORMATS,
    PLACES,
    counted_parameters,
    decode_read_bytes,
    parameters_by_place,
)
from minitransformer.core.kv_cache import estimate_kv_bytes, estimate_kv_bytes_windowed, kv_bytes_per_token
from minitransformer.lab.viz_capacity import LLAMA_3_1_8B, parameter_count

ROOT = Path(__file__).resolve().parents[1]
LESSON = ROOT / "lessons" / "17_model_shape.py"


# ---------------------------------------------------------------------------------------------------- arithmetic

def test_places_add_up_to_the_parameter_count_and_match_the_loaded_arrays(tiny_model):
    for config in (tiny_model.config, LLAMA_3_1_8B):
        by = parameters_by_place(config)
        assert list(by) == list(PLACES) and sum(by.values()) == parameter_count(config)
    assert counted_parameters(tiny_model) == parameters_by_place(tiny_model.config)
    by = parameters_by_place(LLAMA_3_1_8B)                       # the 8B: untied, so two vocabulary tables
    assert by["embedding"] == by["lm_head"] == 128256 * 4096
    assert by["attention"] == 32 * (4096 * (4096 + 2 * 1024) + 4096 * 4096)
    assert by["FFN"] == 32 * 3 * 4096 * 14336


def test_decode_read_bytes_are_the_stored_weights_of_a_tied_model_in_every_format(tiny_model):
    from minitransformer.quantize import quantize_model
    assert tiny_model.config.tied_embeddings
    assert decode_read_bytes(tiny_model.config) == (tiny_model.weight_bytes, tiny_model.lm_head.nbytes)
    for name in ("int8", "int4, lm_head int8"):
        layers, head = FORMATS[name]
        quantized = quantize_model(tiny_model, layers, embedding=head)
        assert decode_read_bytes(tiny_model.config, layers, head)[0] == quantized.weight_bytes, name


def test_an_untied_model_reads_its_lm_head_at_decode_not_its_embedding_table():
    by = parameters_by_place(LLAMA_3_1_8B)
    total, head = decode_read_bytes(LLAMA_3_1_8B, "f16", "f16")
    assert head == 2 * 128256 * 4096
    assert total == 2 * (by["attention"] + by["FFN"]) + 4 * by["norms"] + head        # norms stay float32


def test_windowed_kv_bytes_keep_every_token_of_a_global_layer_and_the_window_of_a_sliding_one(tiny_model):
    cfg = tiny_model.config
    assert not cfg.sliding_layers
    assert estimate_kv_bytes_windowed(cfg, 100, batch=3) == estimate_kv_bytes(cfg, 100, batch=3)
    sliding = dataclasses.replace(cfg, n_layers=3, sliding_layers=(0, 2), sliding_window=8)
    per_layer = kv_bytes_per_token(sliding) // 3
    for tokens in (1, 8, 9, 100):
        assert estimate_kv_bytes_windowed(sliding, tokens) == per_layer * (tokens + 2 * min(tokens, 8))
    assert estimate_kv_bytes_windowed(sliding, 8) == estimate_kv_bytes(sliding, 8)      # within the window: all
    assert estimate_kv_bytes_windowed(sliding, 50, batch=2, storage="int8") == \
        2 * kv_bytes_per_token(sliding, "int8") // 3 * (50 + 2 * 8)


def test_bad_flags_are_one_line_and_exit_code_2_before_any_model_loads():
    result = subprocess.run([sys.executable, str(LESSON), "--repeats", "0"], capture_output=True, text=True,
                            cwd=ROOT, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert result.returncode == 2
    assert result.stderr.strip() == "error: --repeats must be at least 1, got 0"


# ---------------------------------------------------------------------------------------------------- the lesson

def lesson_module():
    spec = importlib.util.spec_from_file_location("lesson_17", LESSON)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def output(real_model_path, gemma_model_path):
    env = dict(os.environ, COLUMNS="120", MINITRANSFORMER_MODEL=str(real_model_path), PYTHONPATH=str(ROOT),
               OPENBLAS_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(LESSON), "--second", str(gemma_model_path), "--prompt-tokens", "16",
                             "--repeats", "2", "--tokens", "3"], capture_output=True, text=True, env=env, cwd=ROOT,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@functools.cache
def gguf_reader(path):
    """gguf's own reader of a file (not our config), opened once: parsing Gemma's 262k-token vocabulary takes ~10 s."""
    import gguf
    return gguf.GGUFReader(path)


def gguf_parameters(path) -> int:
    """Every number the file stores a weight for."""
    return sum(int(t.n_elements) for t in gguf_reader(path).tensors)


def test_the_printed_parameters_are_the_files_and_most_of_gemmas_are_its_embedding(output, real_model_path,
                                                                                     gemma_model_path):
    flat = " ".join(output.split())
    for path, name in ((real_model_path, "SmolLM2-135M-Instruct"), (gemma_model_path, "gemma-3-270m")):
        total = gguf_parameters(path)
        assert f"check arrays {name}: counted {total:,} == config {total:,}" in flat
    reader = gguf_reader(gemma_model_path)
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    share = 100 * int(embd.n_elements) / gguf_parameters(gemma_model_path)
    assert share > 50
    assert re.search(rf"│ gemma-3-270m +│.*│ {share:.1f} +│", output)


def test_the_printed_kv_bytes_and_sliding_layers_follow_the_files_metadata(output, gemma_model_path):
    fields = gguf_reader(gemma_model_path).fields
    get = lambda key: fields[key].contents()
    layers, kv_heads, head_dim = get("gemma3.block_count"), get("gemma3.attention.head_count_kv"), \
        get("gemma3.attention.key_length")
    per_token = 2 * layers * kv_heads * head_dim * 4
    assert re.search(rf"│ gemma-3-270m +│ MQA 4:1 +│ {layers} x {kv_heads} x {head_dim} +│ {per_token:,} +│ "
                     rf"{per_token // 2:,} +│ {per_token:,} +│", output)
    window = get("gemma3.attention.sliding_window")
    from minitransformer.core.config import ModelConfig
    from minitransformer.core.gguf_file import open_gguf
    sliding = ModelConfig.from_gguf(open_gguf(gemma_model_path)).sliding_layers
    assert 0 < len(sliding) < layers
    flat = " ".join(output.split())
    assert f"check window: {len(sliding)} of {layers} layers slide" in flat and f"window {window:,};" in flat
    kept = (layers - len(sliding)) * 32768 + len(sliding) * window
    assert f"they keep {kept:,} of {layers * 32768:,} layer-tokens" in flat
    full = per_token // 2 * 32768 / 2**20                               # bf16, one sequence
    assert re.search(rf"│ gemma-3-270m +│ 32,768 +│ {full:,.1f} +│ {full * kept / (layers * 32768):,.1f} +│", output)


def test_every_untimed_claim_holds_and_the_verdicts_follow_the_numbers(output):
    from minitransformer.lab.claims import printed_verdicts
    module = lesson_module()
    found = {c.key: c for c in module.claims(output)}
    assert {k for k, c in found.items() if not c.timed} == {"params-from-arrays", "embedding-majority", "kv-formula",
                                                            "window-cache", "window-dead", "decode-bytes",
                                                            "lm-head-int4"}
    assert all(c.holds for c in found.values() if not c.timed), [c for c in found.values() if not c.holds]
    printed = printed_verdicts(output)
    assert set(printed) == set(found)
    assert all(printed[k] for k, c in found.items() if not c.timed)
    for key in ("decode-slower", "vocab-decode"):                      # timed: never shown beyond what they hold
        assert not printed[key] or found[key].holds


EDITS = {
    "window-dead": (r"logits\s+by\s+at\s+most\s+0\.0e\+00", "logits by at most 2.0e-01"),
    "params-from-arrays": (r"(check arrays gemma-3-270m: counted )[\d,]+", r"\g<1>268,098,177"),
    "decode-bytes": (r"(check decode bytes gemma-3-270m: computed )[\d,]+", r"\g<1>1"),
    "window-cache": (r"they\s+keep\s+[\d,]+\s+of", "they keep 5 of"),
}


@pytest.mark.parametrize("key", sorted(EDITS))
def test_an_edited_number_flips_its_claim(output, key):
    module = lesson_module()
    pattern, replacement = EDITS[key]
    edited, count = re.subn(pattern, replacement, output, count=1)
    assert count == 1, pattern
    before = {c.key: c.holds for c in module.claims(output)}
    after = {c.key: c.holds for c in module.claims(edited)}
    assert before[key] and not after[key]


def test_a_decode_table_edited_to_make_the_second_model_faster_flips_the_timed_claims(output):
    module = lesson_module()
    lines = output.splitlines()
    header = next(i for i, line in enumerate(lines) if "step min ms" in line)
    row = next(i for i in range(header, len(lines)) if lines[i].startswith("│ gemma-3-270m"))
    cells = lines[row].split("│")
    cells[2] = " 0.1".ljust(len(cells[2]))
    cells[4] = " 0.0".ljust(len(cells[4]))
    lines[row] = "│".join(cells)
    after = {c.key: c.holds for c in module.claims("\n".join(lines))}
    assert not after["decode-slower"] and not after["vocab-decode"]

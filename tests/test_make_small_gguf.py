"""scripts/make_small_gguf.py: the first layers of the real model as a GGUF that loads and generates, every kept
tensor byte for byte the full model's, every metadata key the same but block_count."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import numpy as np

from minitransformer import SamplingParams, generate, load_model
from minitransformer.core.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("make_small_gguf", ROOT / "scripts" / "make_small_gguf.py")
make_small_gguf = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_small_gguf)


def test_two_layers_of_the_real_model_load_generate_and_keep_their_bytes(real_model_path, tmp_path):
    path = tmp_path / "two-layers.gguf"
    assert make_small_gguf.main(["--model", str(real_model_path), "--layers", "2", "-o", str(path)]) == 0

    full_reader, small_reader = gguf.GGUFReader(real_model_path), gguf.GGUFReader(path)
    small = load_model(path)
    assert small.config.n_layers == 2
    assert vars(small.config) == vars(ModelConfig.from_gguf(full_reader)) | {"n_layers": 2}

    full = {t.name: t for t in full_reader.tensors}
    kept = [name for name in full if not name.startswith("blk.") or int(name.split(".")[1]) < 2]
    assert [t.name for t in small_reader.tensors] == kept
    assert {"token_embd.weight", "output_norm.weight", "blk.1.ffn_down.weight"} <= set(kept)
    for tensor in small_reader.tensors:
        original = full[tensor.name]
        assert tensor.tensor_type == original.tensor_type, tensor.name
        assert list(tensor.shape) == list(original.shape), tensor.name
        assert np.asarray(tensor.data).tobytes() == np.asarray(original.data).tobytes(), tensor.name

    block_count = "llama.block_count"
    keys = [k for k in full_reader.fields if not k.startswith("GGUF.")]
    assert [k for k in small_reader.fields if not k.startswith("GGUF.")] == keys
    for key in keys:
        want = 2 if key == block_count else full_reader.fields[key].contents()
        assert small_reader.fields[key].contents() == want, key
        assert small_reader.fields[key].types == full_reader.fields[key].types, key

    out = generate(small, "The capital of France is", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert len(out.token_ids) == 8 and out.finish_reason == "length"


def test_more_layers_than_the_model_has_is_one_line_and_exit_2(real_model_path, tmp_path, capsys):
    assert make_small_gguf.main(["--model", str(real_model_path), "--layers", "31", "-o", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err == "make_small_gguf: --layers must lie in [1, 30] (" + str(real_model_path) + \
        " has 30 layers); got 31\n"
    assert not (tmp_path / "x").exists()

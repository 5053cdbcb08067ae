#!/usr/bin/env python
"""Tiny random-weight Qwen2, Llama 3 and Qwen3 models built in HF transformers, written to GGUF by llama.cpp's own
converter, with HF's float32 logits on fixed token ids: what tests/test_other_families.py holds our forward to.

    python scripts/make_family_references.py OUT_DIR [--converter PATH/convert_hf_to_gguf.py] [--family NAME ...]

Run it with a Python that has torch, transformers, sentencepiece and what the converter imports (the peers cache's
hf-venv: `python scripts/setup_peers.py hf`). For each family it writes into OUT_DIR:

    <family>/               the HF checkpoint (config.json, model.safetensors) and a tiny SentencePiece tokenizer
    <family>.gguf           convert_hf_to_gguf.py <family>/ --outtype f32
    <family>.json           {"ids": [...], "logits": [[...] per position], "hf": the config} (HF float32, eager)

Each family is one thing the llama forward lacks (the biases of Qwen2's q/k/v, Llama 3's RoPE frequency scaling,
Qwen3's per-head q/k RMSNorm), so its config is small but sized so that the thing matters: every weight is random
(the seed fixes it), biases and norm scales included, since HF initialises biases to 0 and norms to 1, which would
make a missing bias or norm invisible; Llama 3's original context is 64 positions and the ids run past it, so all
three regimes of its frequency factors (kept, scaled, interpolated) turn real angles.

The tokenizer is out of scope: the converter needs one to write a loadable file, so a 200-piece SentencePiece model
is trained on the repository's README; the comparison runs on token ids.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = 0
VOCAB = 256                      # the model's rows; the tokenizer's 200 pieces, the rest [PAD] rows the converter adds
SPM_PIECES = 200
N_IDS = 80                       # positions compared: past Llama 3's 64-position original context below
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
              bos_token_id=1, eos_token_id=2)
FAMILIES = {
    # Qwen2: q, k and v projections with biases (hard-wired in HF's Qwen2Attention), neox RoPE, untied lm_head
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=False, use_sliding_window=False)),
    # Llama 3: RoPE frequency factors (HF rope_type "llama3"; the converter writes them as rope_freqs.weight)
    "llama3": ("LlamaConfig", "LlamaForCausalLM",
               dict(tie_word_embeddings=True, head_dim=16,
                    rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                      original_max_position_embeddings=64))),
    # Qwen3: an RMSNorm on each query and key head before RoPE; head_dim 32 x 4 heads != hidden 64 (key_length)
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(tie_word_embeddings=True, head_dim=32, attention_bias=False)),
}


def randomize(model, torch) -> None:
    """Every parameter random under the seed: matrices N(0, 1/fan_in) (activations stay O(1)), the embedding N(0, 1),
    biases N(0, 0.5), norm scales 1 + N(0, 0.2)."""
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if "norm" in name:
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.5 * noise)
            elif "embed_tokens" in name:
                param.copy_(noise)
            else:
                param.copy_(noise / param.shape[-1] ** 0.5)


def write_tokenizer(folder: Path) -> None:
    """tokenizer.model: a tiny SentencePiece model (the converter's _set_vocab_sentencepiece reads it)."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(input=str(ROOT / "README.md"), model_prefix=str(folder / "tokenizer"),
                                   vocab_size=SPM_PIECES, model_type="bpe", character_coverage=1.0,
                                   hard_vocab_limit=False, num_threads=1, minloglevel=2)
    (folder / "tokenizer.vocab").unlink()


def build(family: str, out: Path, converter: Path) -> subprocess.Popen:
    """Build and save one family's model, start its converter (a process of its own), write HF's logits while it
    runs. -> the converter's process, for main() to wait on: the conversions overlap instead of taking turns (each
    one mostly imports torch)."""
    import numpy as np
    import torch
    import transformers

    config_class, model_class, extra = FAMILIES[family]
    config = getattr(transformers, config_class)(**COMMON, **extra)
    torch.manual_seed(SEED)
    model = getattr(transformers, model_class)(config).to(torch.float32).eval()
    randomize(model, torch)
    folder = out / family
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    gguf = out / f"{family}.gguf"
    converting = subprocess.Popen([sys.executable, str(converter), str(folder), "--outfile", str(gguf), "--outtype",
                                   "f32"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    ids = np.random.default_rng(SEED).integers(0, VOCAB, N_IDS).tolist()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].numpy()                 # (T, V) float32
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "dtype": str(logits.dtype),
            "hf": config.to_dict()}
    (out / f"{family}.json").write_text(json.dumps({"meta": meta, "ids": ids, "logits": logits.tolist()}))
    return converting


def finish(family: str, out: Path, converting: subprocess.Popen) -> None:
    """Wait for a family's converter; one line naming the family and the converter's last words if it failed."""
    _, stderr = converting.communicate()
    if converting.returncode != 0:
        sys.exit(f"{family}: convert_hf_to_gguf.py failed (exit {converting.returncode}): "
                 + " | ".join(stderr.strip().splitlines()[-3:]))
    print(f"{family}: wrote {out / f'{family}.gguf'} and {family}.json", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--converter", type=Path, required=True, help="llama.cpp's convert_hf_to_gguf.py")
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES))
    args = parser.parse_args()
    converting = {family: build(family, args.out, args.converter) for family in args.family or FAMILIES}
    for family, process in converting.items():
        finish(family, args.out, process)


if __name__ == "__main__":
    main()

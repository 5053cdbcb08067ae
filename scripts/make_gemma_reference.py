#!/usr/bin/env python
"""Write tests/fixtures/gemma_reference.json: HF transformers float32 logits and greedy ids on Gemma 3 270M.

HF's `Gemma3ForCausalLM` loads the same GGUF file (transformers dequantizes it with the gguf package and takes the
1 back off the norm weights that llama.cpp's converter added, then runs its own Gemma 3 code), so it is an independent
implementation of the same math: the (1 + w) norms, q/k norms, sandwich norms, GELU, the sqrt(d_model) embedding
scale, and the sliding-window layers with their own RoPE base. The prompts are 16, 600 and 1,100 tokens: the two long
ones are past the 512-token window, so a local layer that attended too far (or not far enough) changes the logits.

Prompts are cut from the repository's README, tokenized by our tokenizer with BOS first (tests/test_tokenizer_spm.py
holds our Gemma 3 ids to llama.cpp's); the ids are stored, so the test does not depend on the tokenizer. For each
prompt the fixture keeps only what tests/test_gemma.py compares: the TOP_K largest logits at the last position (ids
and values), max |logit| there (the scale of the relative tolerance), and NEW_TOKENS greedy ids, never stopping at EOS.

Needs torch and transformers (the `peers` extra, or /work/peers/vllm-venv/bin/python on the project's machine):
    python scripts/make_gemma_reference.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from make_hf_fixture import greedy_ids  # HF's cached argmax loop, shared with the SmolLM2 fixture
from minitransformer import load_tokenizer
from minitransformer.models import resolve_model_path

OUT = ROOT / "tests" / "fixtures" / "gemma_reference.json"
TOP_K, NEW_TOKENS = 5, 16
LENGTHS = (16, 600, 1100)        # prompt tokens, BOS included: one inside the 512-token window, two past it


def prompt_ids(tokenizer, n: int) -> list[int]:
    """BOS and the first n - 1 tokens of the README (repeated if it were ever shorter)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    ids = tokenizer.encode(text)
    while len(ids) < n:
        ids = ids + ids
    return [tokenizer.bos_id] + ids[:n - 1]


def main() -> None:
    import torch
    from transformers import Gemma3ForCausalLM

    torch.manual_seed(0)
    path = resolve_model_path("gemma3-270m")
    tokenizer = load_tokenizer(path)
    start = time.perf_counter()
    model = Gemma3ForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                              attn_implementation="eager")
    model.eval()
    print(f"HF model loaded in {time.perf_counter() - start:.1f} s; layer types {model.config.layer_types}",
          file=sys.stderr)
    cases = []
    for n in LENGTHS:
        ids = prompt_ids(tokenizer, n)
        with torch.no_grad():
            last = model(torch.tensor([ids])).logits[0, -1].numpy()                # (V,) float32
        top = np.argsort(-last, kind="stable")[:TOP_K]
        greedy = greedy_ids(model, ids, NEW_TOKENS)
        cases.append({
            "name": f"{n}_tokens", "ids": ids,
            "top_ids": top.tolist(), "top_logits": last[top].round(6).tolist(),
            "max_abs": round(float(np.abs(last).max()), 6),
            "greedy": greedy,
        })
        print(f"{n} tokens: greedy -> {tokenizer.decode(greedy)!r}", file=sys.stderr)
    import transformers
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
            "model": path.name, "top_k": TOP_K, "new_tokens": NEW_TOKENS,
            "layer_types": list(model.config.layer_types), "sliding_window": model.config.sliding_window}
    OUT.write_text(json.dumps({"meta": meta, "cases": cases}, separators=(",", ":"), ensure_ascii=False))
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)


if __name__ == "__main__":
    main()

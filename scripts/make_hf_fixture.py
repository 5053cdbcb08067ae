#!/usr/bin/env python
"""Write tests/fixtures/hf_reference.json: HF transformers float32 logits and greedy ids on the default model.

HF's `LlamaForCausalLM` loads the same GGUF file (transformers dequantizes it with the gguf package and un-permutes
Q/K back to the HF layout, then uses rotate-half RoPE), so it is an independent implementation of the same math.
For each prompt the fixture keeps, per position: the 16 largest logits, 8 logits at fixed random ids (to cover the
tail of the distribution) and max |logit| (the scale of the relative tolerance); and 32 greedy ids generated
without stopping at EOS. Prompts are tokenized with our tokenizer (which tests/test_tokenizer.py proves equal to
llama.cpp's); the ids are stored, so the test does not depend on the tokenizer.

Needs the `peers` extra (torch==2.13.0, transformers, accelerate):
    pip install -e '.[peers]' && python scripts/make_hf_fixture.py
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minitransformer import load_tokenizer
from minitransformer.models import resolve_model_path

OUT = ROOT / "tests" / "fixtures" / "hf_reference.json"
TOP_K, RANDOM_IDS, NEW_TOKENS = 16, 8, 32

LONG_TEXT = """\
A language model does not write an answer all at once. It reads the prompt, turns every word piece into a vector,
and passes those vectors through a stack of identical layers. Each layer lets every position look back at the
positions before it, mixes what it finds, and hands the result to the next layer. At the top, the last position
holds a score for every entry of the vocabulary, and one of those entries becomes the next token. The new token is
appended to the text and the whole procedure repeats, one token at a time, until the model produces an end marker
or the caller's limit is reached. Serving systems split this work into two phases. During the first phase, called
prefill, all prompt positions are processed together, which keeps the arithmetic units busy. During the second
phase, called decode, only one new position is processed per step, so most of the time goes into reading the
weights and the cached keys and values from memory. Engineers measure the first phase with the time to the first
token and the second with the gap between tokens. A cache of keys and values avoids recomputing the past, but it
grows with every token and with every request in the batch, which is why memory, not arithmetic, usually decides
how many users one accelerator can serve at once. Paged caches, continuous batching and quantization are the usual
answers, and each of them trades something for that memory.
"""

PROMPTS = [
    ("capital", False, "The capital of France is"),
    ("chat", True, "Explain in two sentences what a KV cache is."),
    ("code", False, "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("numbers", False, "In 1969, 3 astronauts flew 384,400 km to the Moon; the trip took"),
    ("unicode", False, "Café, naïve, 東京, Москва — emoji 👍🏽 and tabs\tand\nnew lines"),
    ("long", False, LONG_TEXT),
]


def main() -> None:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    path = resolve_model_path(None)
    tokenizer = load_tokenizer(path)
    start = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.eval()
    print(f"HF model loaded in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    rng = np.random.default_rng(0)
    cases = []
    for name, chat, text in PROMPTS:
        prompt = tokenizer.render_chat([{"role": "user", "content": text}]) if chat else text
        ids = tokenizer.encode(prompt, special=chat)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].numpy()                  # (T, V) float32
        top = np.argsort(-logits, axis=-1, kind="stable")[:, :TOP_K]                # (T, TOP_K)
        probe = rng.integers(0, logits.shape[-1], size=(len(ids), RANDOM_IDS))      # (T, RANDOM_IDS)
        columns = np.concatenate([top, probe], axis=1)
        greedy = greedy_ids(model, ids)
        cases.append({
            "name": name, "chat": chat, "prompt": prompt, "ids": ids,
            "logit_ids": columns.tolist(),
            "logits": np.take_along_axis(logits, columns, axis=1).round(6).tolist(),
            "max_abs": np.abs(logits).max(axis=1).round(6).tolist(),
            "greedy": greedy,
        })
        print(f"{name}: {len(ids)} tokens, greedy -> {tokenizer.decode(greedy)!r}", file=sys.stderr)
    import transformers
    meta = {"transformers": transformers.__version__, "torch": torch.__version__, "dtype": "float32",
            "model": path.name, "top_k": TOP_K, "random_ids": RANDOM_IDS, "new_tokens": NEW_TOKENS}
    OUT.write_text(json.dumps({"meta": meta, "cases": cases}, separators=(",", ":"), ensure_ascii=False))
    print(f"wrote {OUT} ({OUT.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)


def greedy_ids(model, ids: list[int], new_tokens: int = NEW_TOKENS) -> list[int]:
    """new_tokens argmax steps with HF's own KV cache, never stopping at EOS (the test passes no stop ids)."""
    import torch

    out, past, step_input = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(new_tokens):
            result = model(step_input, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(torch.argmax(result.logits[0, -1]))
            out.append(token)
            step_input = torch.tensor([[token]])
    return out


if __name__ == "__main__":
    main()

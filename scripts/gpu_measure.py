"""What scripts/gpu_check.py measures, one function per number: greedy tokens and logits, decode and prefill
tokens per second (generate()'s path and the serving Engine's, with and without CUDA graphs), and HF transformers'
decode on the same GPU. Each takes a loaded model and works on either device (the --device cpu dry run uses them).
Every timing goes through minitransformer/lab/measure.py: a warm-up, then repeats (each after its own untimed setup
where a run changes its cache), and the fastest run's rate is returned (noise only ever adds time).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minitransformer.core.backend import synchronize, to_host
from minitransformer.core.decode import decode_step
from minitransformer.core.kv_cache import KVCache
from minitransformer.core.prefill import prefill
from minitransformer.lab.measure import Timing, time_calls

REPEATS = 3


def greedy(model, ids: list[int], steps: int):
    """Greedy tokens and the stacked host logits of prefill + `steps` decode steps, batch 1."""
    cache = KVCache(model.config, max_len=len(ids) + steps, xp=model.xp)
    logits = prefill(model, ids, cache)                                  # (1, V)
    tokens, all_logits = [], [to_host(logits)]
    for _ in range(steps):
        token = logits.argmax(-1)                                        # (1,) on the device
        tokens.append(int(to_host(token)[0]))
        logits = decode_step(model, token, cache)
        all_logits.append(to_host(logits))
    return tokens, np.concatenate(all_logits)


def decode_speed(model, batch: int, prompt_len: int = 32, steps: int = 32) -> float:
    """generate()'s decode path (contiguous KVCache) in tokens per second after a `prompt_len` prefill, token choice
    on the device: the fastest of REPEATS runs, each on a fresh cache after an untimed prefill and warm-up step."""
    xp = model.xp
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (batch, prompt_len))
    seconds = []
    for _ in range(REPEATS):
        cache = KVCache(model.config, max_len=prompt_len + steps + 1, batch=batch, xp=xp)
        token = prefill(model, ids, cache).argmax(-1)                    # (B,)
        token = decode_step(model, token, cache).argmax(-1)              # warm-up step
        synchronize(xp)

        def steps_run(token=token, cache=cache):
            for _ in range(steps - 1):
                token = decode_step(model, token, cache).argmax(-1)
        seconds.append(time_calls(steps_run, repeats=1, warmup=0, sync=lambda: synchronize(xp)).min)
    return batch * (steps - 1) / Timing(tuple(seconds)).min


def engine_decode(model, batch: int, cuda_graphs: bool, prompt_len: int = 32, steps: int = 64) -> dict:
    """Serving decode: `batch` greedy requests through the Engine; tok/s over its decode-only steps (their wall time,
    sampling and streaming included), and every request's tokens."""
    from minitransformer import SamplingParams
    from minitransformer.serving import Engine
    rng = np.random.default_rng(batch)
    engine = Engine(model, max_num_seqs=batch, max_num_batched_tokens=max(512, batch * prompt_len),
                    max_model_len=prompt_len + steps + 16, cuda_graphs=cuda_graphs)
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(rng.integers(3, model.config.vocab_size, prompt_len).tolist(), params)
           for _ in range(batch)]
    results = engine.run()
    timed = [r for r in engine.step_log[2:] if r.num_prefill_tokens == 0]   # the first two: prefill, graph capture
    tokens = sum(r.num_decode_tokens for r in timed)
    return {"tok_s": tokens / sum(r.duration_s for r in timed), "tokens": [results[i].token_ids for i in ids],
            "replays": sum(engine.graphs.replays.values()) if engine.graphs else 0,
            "graphs_disabled": engine.graphs.disabled if engine.graphs else None}


def prefill_speed(model, tokens: int) -> float:
    xp = model.xp
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, tokens).tolist()
    timing = time_calls(lambda: prefill(model, ids, KVCache(model.config, max_len=tokens, xp=xp)), repeats=REPEATS,
                        sync=lambda: synchronize(xp))                    # a warm-up, then the fastest of REPEATS
    return tokens / timing.min


def hf_decode_speed(model_path: Path, steps: int = 64) -> dict:
    """HF transformers greedy decode tok/s at batch 1 on the GPU, from the same GGUF (dequantized by transformers)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError as exc:
        return {"skipped": f"transformers/torch not importable ({exc})"}
    if not torch.cuda.is_available():
        return {"skipped": "torch has no CUDA device"}
    hf = AutoModelForCausalLM.from_pretrained(str(model_path.parent), gguf_file=model_path.name,
                                              torch_dtype=torch.float32).cuda().eval()
    ids = torch.randint(0, hf.config.vocab_size, (1, 32), device="cuda")
    with torch.no_grad():
        hf.generate(ids, max_new_tokens=4, do_sample=False)              # warm-up
        timing = time_calls(lambda: hf.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False),
                            repeats=REPEATS, warmup=0, sync=torch.cuda.synchronize)
    return {"tok_per_s": steps / timing.min}

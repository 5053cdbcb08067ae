"""One command for a machine with an NVIDIA GPU: the GPU tests, then the engine's numbers, as a table and JSON.

    python scripts/gpu_check.py [--json gpu_check.json] [--model PATH] [--quick]

No network: the model file comes from --model or $MINITRANSFORMER_MODEL. It reports
1. the GPU tests (tests/test_gpu_backend.py, tests/test_kernels.py) run under pytest;
2. greedy tokens GPU == CPU for 3 prompts, and the largest logits difference;
3. decode tok/s at batch 1, 8 and 64 (contiguous KVCache batches), prefill tok/s at 512 and 4096 tokens;
4. a one-token forward launched plainly vs replayed as a CUDA graph (minitransformer/cuda_graph.py);
5. the kernels' correctness and bandwidth (scripts/gpu_check_kernels.py --quick, folded in);
6. HF transformers on the same GPU and GGUF (greedy decode tok/s at batch 1) when torch with CUDA is there.
Without a GPU every GPU part is skipped with its reason, the JSON says so, and the exit code is 0.
Exit code 1 when a check fails (tests, token mismatch, kernel correctness).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))                          # run from a checkout without installing

from minitransformer.backend import synchronize, to_host  # noqa: E402
from minitransformer.decode import decode_step  # noqa: E402
from minitransformer.kv_cache import KVCache  # noqa: E402
from minitransformer.prefill import prefill  # noqa: E402

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]


def gpu_reason() -> str | None:
    """None when CuPy sees a GPU, else why not."""
    try:
        import cupy
        return None if cupy.cuda.runtime.getDeviceCount() > 0 else "CuPy sees no NVIDIA GPU"
    except Exception as exc:  # ImportError, or a CUDA driver error
        return f"no usable CuPy/GPU ({type(exc).__name__}: {exc})"


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
    """Decode tokens per second (all sequences together) after a `prompt_len` prefill, token choice on the device."""
    xp = model.xp
    ids = np.random.default_rng(0).integers(0, model.config.vocab_size, (batch, prompt_len))
    cache = KVCache(model.config, max_len=prompt_len + steps + 1, batch=batch, xp=xp)
    token = prefill(model, ids, cache).argmax(-1)                        # (B,)
    token = decode_step(model, token, cache).argmax(-1)                  # warm-up step
    synchronize(xp)
    start = time.perf_counter()
    for _ in range(steps - 1):
        token = decode_step(model, token, cache).argmax(-1)
    synchronize(xp)
    return batch * (steps - 1) / (time.perf_counter() - start)


def prefill_speed(model, tokens: int) -> float:
    xp = model.xp
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, tokens).tolist()
    prefill(model, ids[:64], KVCache(model.config, max_len=64, xp=xp))   # warm-up
    synchronize(xp)
    start = time.perf_counter()
    prefill(model, ids, KVCache(model.config, max_len=tokens, xp=xp))
    synchronize(xp)
    return tokens / (time.perf_counter() - start)


def graph_vs_plain(model) -> dict:
    """A one-token forward without cache (every matmul of a decode step, attention over 1 key) plain vs graph."""
    from minitransformer.cuda_graph import time_replay_vs_plain
    xp = model.xp
    ids, positions = xp.zeros((1, 1), dtype=xp.int64), xp.zeros((1, 1), dtype=xp.int64)
    times = time_replay_vs_plain(lambda i, p: model.forward(i, p, last_only=True), ids, positions)
    return {**times, "speedup": times["plain_s"] / times["graph_s"]}


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
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = hf.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False)
        torch.cuda.synchronize()
    return {"tok_per_s": (out.shape[1] - ids.shape[1]) / (time.perf_counter() - start)}


def run_gpu_parts(args, report: dict) -> bool:
    """Every GPU measurement into `report`; True when all checks passed."""
    from minitransformer import load_model
    ok = True
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_gpu_backend.py", "tests/test_kernels.py"],
                           cwd=ROOT, capture_output=True, text=True)
    report["tests"] = {"returncode": tests.returncode, "summary": tests.stdout.strip().splitlines()[-1:]}
    ok &= tests.returncode == 0

    cpu = load_model(args.model, attention="arrays")
    gpu = load_model(args.model, device="gpu")                           # auto: attention through the kernels
    rows = []
    for text in PROMPTS:
        ids = cpu.tokenizer.encode(text)
        tokens_c, logits_c = greedy(cpu, ids, args.tokens)
        tokens_g, logits_g = greedy(gpu, ids, args.tokens)
        rows.append({"prompt": text, "tokens_equal": tokens_c == tokens_g,
                     "max_logits_diff": float(np.abs(logits_c - logits_g).max())})
    report["cpu_vs_gpu"] = rows
    ok &= all(r["tokens_equal"] for r in rows)

    report["decode_tok_s"] = {str(b): decode_speed(gpu, b) for b in (1, 8, 64)}
    report["prefill_tok_s"] = {str(t): prefill_speed(gpu, t) for t in ((512,) if args.quick else (512, 4096))}
    try:
        report["cuda_graph"] = graph_vs_plain(gpu)
    except Exception as exc:  # report, don't hide: capture rules broken somewhere in the forward
        report["cuda_graph"] = {"failed": f"{type(exc).__name__}: {exc}"}
    kernels_json = Path(args.json).with_suffix(".kernels.json")
    kernels = subprocess.run([sys.executable, "scripts/gpu_check_kernels.py", "--quick", "--json", str(kernels_json)],
                             cwd=ROOT, capture_output=True, text=True)
    report["kernels"] = (json.loads(kernels_json.read_text()) if kernels_json.exists()
                         else {"failed": kernels.stderr.strip()[-500:]})
    ok &= kernels.returncode == 0
    try:
        report["hf_transformers"] = hf_decode_speed(Path(gpu.path))
    except Exception as exc:  # a transformers version without GGUF support for this model, etc.
        report["hf_transformers"] = {"skipped": f"{type(exc).__name__}: {exc}"}
    return ok


def print_table(report: dict) -> None:
    if "skipped" in report:
        print(f"GPU parts skipped: {report['skipped']}")
        for part in report["parts"]:
            print(f"  skipped: {part}")
        return
    print(f"tests: {report['tests']}")
    print(f"{'prompt':<36}{'tokens GPU == CPU':>18}{'max |logits diff|':>20}")
    for r in report["cpu_vs_gpu"]:
        print(f"{r['prompt'][:35]:<36}{str(r['tokens_equal']):>18}{r['max_logits_diff']:>20.2e}")
    for name in ("decode_tok_s", "prefill_tok_s"):
        print(name + ": " + ", ".join(f"{k}: {v:,.0f}" for k, v in report[name].items()))
    print(f"cuda graph: {report['cuda_graph']}")
    print(f"HF transformers: {report['hf_transformers']}")
    print(f"kernels: copy {report['kernels'].get('copy', {})}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="gpu_check.json", help="where to write the numbers")
    parser.add_argument("--model", default=os.environ.get("MINITRANSFORMER_MODEL"), help="the GGUF file")
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt for GPU == CPU")
    parser.add_argument("--quick", action="store_true", help="skip the 4096-token prefill")
    args = parser.parse_args(argv)
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S")}
    reason = gpu_reason()
    ok = True
    if reason:
        report.update(gpu=False, skipped=reason,
                      parts=["GPU tests", "GPU == CPU tokens", "decode/prefill tok/s", "CUDA graph",
                             "kernel bandwidth", "HF transformers"])
    else:
        report["gpu"] = True
        ok = run_gpu_parts(args, report)
    print_table(report)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

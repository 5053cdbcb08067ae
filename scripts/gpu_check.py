"""One command for a machine with an NVIDIA GPU: the GPU tests, then the engine's numbers, as a table and JSON.

    python scripts/gpu_check.py [--json gpu_check.json] [--model PATH] [--quick]

No network: the model file comes from --model or $MINITRANSFORMER_MODEL. It reports
1. the GPU tests (tests/test_gpu_backend.py, tests/test_kernels.py) run under pytest;
2. greedy tokens GPU == CPU for 3 prompts, and the largest logits difference;
3. serving decode tok/s at batch 1, 8 and 64 through the Engine (paged cache, paged_decode kernel), with decode
   steps replayed from CUDA graphs and launched plainly, and their tokens compared (serving/graph_runner.py);
   decode tok/s of generate()'s path (contiguous KVCache) at batch 1; prefill tok/s at 512 and 4096 tokens;
4. the same decode at batch 1 with float16 weights (float32 accumulation), and its tokens against float32's;
5. the kernels' correctness and bandwidth (scripts/gpu_check_kernels.py --quick, folded in);
6. HF transformers on the same GPU and GGUF (greedy decode tok/s at batch 1) when torch with CUDA is there, and
   the target ratio: our decode at batch 1 with graphs / HF's (issue 8 asks >= 5x).
Without a GPU every GPU part is skipped with its reason, the JSON says so, and the exit code is 0.
`--device cpu` runs parts 2-4 on the CPU instead (a dry run of this script's own code: the tests use it on a tiny
model; parts 1, 5 and 6 are GPU-only). Exit code 1 when a check fails (tests, token mismatch, kernel correctness)
or a part raises: that part is recorded with its traceback and the others still run; the JSON is rewritten after
every part, so a run stopped by a time limit keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
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
    """generate()'s decode path (contiguous KVCache) in tokens per second after a `prompt_len` prefill, token choice
    on the device."""
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
    prefill(model, ids[:64], KVCache(model.config, max_len=64, xp=xp))   # warm-up
    synchronize(xp)
    start = time.perf_counter()
    prefill(model, ids, KVCache(model.config, max_len=tokens, xp=xp))
    synchronize(xp)
    return tokens / (time.perf_counter() - start)


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


def run_gpu_parts(args, report: dict, save) -> bool:
    """Every measurement into `report`, one part at a time; True when all checks passed.

    A part that raises is recorded as {"failed": ...} and the others still run; `save(report)` after each part, so a
    run cut short by a time limit keeps what it measured. args.device "cpu" is the dry run (GPU-only parts left out).
    """
    from minitransformer import load_model
    on_gpu = args.device == "gpu"
    attention = "auto" if on_gpu else "arrays"                  # auto: the kernels on the GPU
    loaded = {}

    def model(dtype: str = "float32"):
        if dtype not in loaded:
            loaded[dtype] = load_model(args.model, device=args.device, attention=attention, dtype=dtype)
        return loaded[dtype]

    def gpu_tests():
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_gpu_backend.py",
                              "tests/test_kernels.py", "tests/test_graph_runner.py"],
                             cwd=ROOT, capture_output=True, text=True)
        return {"returncode": run.returncode, "summary": run.stdout.strip().splitlines()[-1:]}, run.returncode == 0

    def cpu_vs_gpu():
        cpu, rows = load_model(args.model, attention="arrays"), []
        for text in PROMPTS:
            ids = cpu.tokenizer.encode(text)
            tokens_c, logits_c = greedy(cpu, ids, args.tokens)
            tokens_g, logits_g = greedy(model(), ids, args.tokens)
            rows.append({"prompt": text, "tokens_equal": tokens_c == tokens_g,
                         "max_logits_diff": float(np.abs(logits_c - logits_g).max())})
        return rows, all(r["tokens_equal"] for r in rows)

    def engine():
        rows = {}
        for batch in args.batches:
            plain, graphed = engine_decode(model(), batch, False), engine_decode(model(), batch, True)
            rows[str(batch)] = {"plain_tok_s": plain["tok_s"], "graphs_tok_s": graphed["tok_s"],
                                "speedup": graphed["tok_s"] / plain["tok_s"], "replays": graphed["replays"],
                                "tokens_equal": graphed["tokens"] == plain["tokens"],
                                "graphs_disabled": graphed["graphs_disabled"]}
        return rows, all(r["tokens_equal"] and r["graphs_disabled"] is None for r in rows.values())

    def speeds():
        return {"generate_decode_tok_s": {"1": decode_speed(model(), 1)},
                "prefill_tok_s": {str(t): prefill_speed(model(), t) for t in args.prefill}}, True

    def float16():
        f16, f32 = engine_decode(model("float16"), 1, True), engine_decode(model(), 1, True)
        agree = next((i for i, (a, b) in enumerate(zip(f16["tokens"][0], f32["tokens"][0])) if a != b),
                     len(f32["tokens"][0]))
        return {"graphs_tok_s": f16["tok_s"], "float32_graphs_tok_s": f32["tok_s"],
                "weight_bytes": model("float16").weight_bytes, "float32_weight_bytes": model().weight_bytes,
                "tokens_equal_to_float32": agree, "graphs_disabled": f16["graphs_disabled"]}, True

    def kernels():
        kernels_json = Path(args.json).with_suffix(".kernels.json")
        run = subprocess.run([sys.executable, "scripts/gpu_check_kernels.py", "--quick", "--json", str(kernels_json)],
                             cwd=ROOT, capture_output=True, text=True)
        result = json.loads(kernels_json.read_text()) if kernels_json.exists() else {"failed": run.stderr[-500:]}
        return result, run.returncode == 0

    def hf_transformers():
        return hf_decode_speed(Path(model().path)), True         # a skip (no torch, no CUDA) is not a failure

    ok = True
    parts = [("tests", gpu_tests, on_gpu), ("cpu_vs_gpu", cpu_vs_gpu, True), ("engine_decode", engine, True),
             ("speeds", speeds, True), ("float16", float16, True), ("kernels", kernels, on_gpu),
             ("hf_transformers", hf_transformers, on_gpu)]
    for name, part, wanted in parts:
        if not wanted:
            continue
        start = time.perf_counter()
        try:
            result, passed = part()
        except Exception as exc:  # recorded, not fatal: the other parts' numbers still matter
            result = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            passed = False
        report[name], ok = result, ok and passed
        report.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 1)
        print(f"[{name}] {'ok' if passed else 'FAILED'} in {report['seconds'][name]:.0f} s", file=sys.stderr,
              flush=True)
        save(report)
    hf = report.get("hf_transformers", {}).get("tok_per_s")
    ours = report.get("engine_decode", {}).get("1", {}).get("graphs_tok_s")
    if hf and ours:
        report["target_decode_b1_graphs_over_hf"] = {"ratio": ours / hf, "target": 5.0, "met": ours / hf >= 5.0}
    return ok


def print_table(report: dict) -> None:
    if "skipped" in report:
        print(f"GPU parts skipped: {report['skipped']}")
        for part in report["parts"]:
            print(f"  skipped: {part}")
        return
    failed = [name for name, value in report.items() if isinstance(value, dict) and "failed" in value]
    for name in failed:
        print(f"{name}: FAILED {report[name]['failed']}")
    if "tests" in report and "tests" not in failed:
        print(f"tests: {report['tests']}")
    if "cpu_vs_gpu" in report and "cpu_vs_gpu" not in failed:
        print(f"{'prompt':<36}{'tokens GPU == CPU':>18}{'max |logits diff|':>20}")
        for r in report["cpu_vs_gpu"]:
            print(f"{r['prompt'][:35]:<36}{str(r['tokens_equal']):>18}{r['max_logits_diff']:>20.2e}")
    if "engine_decode" in report and "engine_decode" not in failed:
        print(f"{'engine decode, batch':<22}{'plain tok/s':>12}{'graphs tok/s':>14}{'speedup':>9}{'same tokens':>13}")
        for batch, r in report["engine_decode"].items():
            print(f"{batch:<22}{r['plain_tok_s']:>12,.0f}{r['graphs_tok_s']:>14,.0f}{r['speedup']:>8.2f}x"
                  f"{str(r['tokens_equal']):>13}")
    if "speeds" in report and "speeds" not in failed:
        for name, values in report["speeds"].items():
            print(name + ": " + ", ".join(f"{k}: {v:,.0f}" for k, v in values.items()))
    if "float16" in report and "float16" not in failed:
        f16 = report["float16"]
        print(f"float16 weights: decode b1 {f16['graphs_tok_s']:,.0f} tok/s with graphs (float32 "
              f"{f16['float32_graphs_tok_s']:,.0f}), {f16['weight_bytes'] / 2**20:,.1f} MiB (float32 "
              f"{f16['float32_weight_bytes'] / 2**20:,.1f}), first {f16['tokens_equal_to_float32']} tokens equal to "
              "float32's")
    for name in ("hf_transformers", "target_decode_b1_graphs_over_hf"):
        if name in report and name not in failed:
            print(f"{name}: {report[name]}")
    if "kernels" in report and "kernels" not in failed:
        print(f"kernels: copy {report['kernels'].get('copy', {})}")
    if "seconds" in report:
        print("seconds per part: " + ", ".join(f"{k} {v:.0f}" for k, v in report["seconds"].items()))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="gpu_check.json", help="where to write the numbers")
    parser.add_argument("--model", default=os.environ.get("MINITRANSFORMER_MODEL"), help="the GGUF file")
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens per prompt for GPU == CPU")
    parser.add_argument("--quick", action="store_true", help="skip the 4096-token prefill")
    parser.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                        help="cpu: a dry run of the measurements on the CPU (GPU-only parts left out)")
    parser.add_argument("--batches", default="1,8,64", help="engine decode batch sizes, comma-separated")
    parser.add_argument("--prefill", default=None, help="prefill lengths (default 512,4096; --quick 512)")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    args.prefill = ([int(t) for t in args.prefill.split(",")] if args.prefill
                    else [512] if args.quick else [512, 4096])
    report = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "device": args.device}
    save = lambda r: Path(args.json).write_text(json.dumps(r, indent=2))   # noqa: E731
    reason = gpu_reason() if args.device == "gpu" else None
    ok = True
    if reason:
        report.update(gpu=False, skipped=reason,
                      parts=["GPU tests", "GPU == CPU tokens", "decode/prefill tok/s, CUDA graphs vs plain",
                             "float16 weights", "kernel bandwidth", "HF transformers"])
    else:
        report["gpu"] = args.device == "gpu"
        ok = run_gpu_parts(args, report, save)
    print_table(report)
    save(report)
    print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

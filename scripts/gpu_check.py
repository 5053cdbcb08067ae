"""One command for a machine with an NVIDIA GPU: the GPU tests, then the engine's numbers, as a table and JSON.

    python scripts/gpu_check.py [--model PATH] [--json gpu_check.json] [--quick] [--device gpu|cpu]

Needs only what the gpu extra installs (README, "On an NVIDIA GPU") and no network. The model file comes from
--model, $MINITRANSFORMER_MODEL or the cache; when there is none it says so in one line and exits 2 (it never
downloads). First it checks that the GPU is usable (gpu_probe.py: CuPy imports, a device is there, a kernel with
<cuda_fp16.h> compiles and runs): if not, it prints why and what to install, and exits 2. Then it reports
1. the GPU tests (tests/test_gpu_backend.py, test_kernels.py, test_graph_runner.py) run under pytest, which the dev
   extra brings, with g++ and nm for their CPU-runner half; without them this part says what to add and is not run;
2. greedy tokens GPU == CPU for 3 prompts, and the largest logits difference, in checked mode (a bad block id is
   named instead of ending the CUDA context; kernels/checked.py);
3. serving decode tok/s at batch 1, 8 and 64 through the Engine (paged cache, paged_decode kernel), with decode
   steps replayed from CUDA graphs and launched plainly, and their tokens compared (serving/graph_runner.py);
   decode tok/s of generate()'s path (contiguous KVCache) at batch 1; prefill tok/s at 512 and 4096 tokens;
4. the same decode at batch 1 with float16 weights (float32 accumulation), and its tokens against float32's;
5. the kernels' correctness and bandwidth (scripts/gpu_check_kernels.py --quick, folded in);
6. HF transformers on the same GPU and GGUF (greedy decode tok/s at batch 1) when torch with CUDA is there, and
   the target ratio: our decode at batch 1 with graphs / HF's (the project's target: >= 5x).
Parts 3-6 run unchecked (checked mode costs a host copy per launch and cannot be captured in a CUDA graph).
`--device cpu` runs parts 2-4 on the CPU instead (a dry run of this script's own code: the tests use it on a tiny
model; parts 1, 5 and 6 are GPU-only). Exit code 0 when every check passed, 1 when one failed (tests, token mismatch,
kernel correctness) or a part raised: that part is recorded with its traceback and the others still run; the JSON is
rewritten after every part, so a run stopped by a time limit keeps what it measured. Exit code 2: no usable GPU
(with --device gpu) or no model file.

On a GPU machine with no network that is sent at most 64 MiB of files per call (the 98 MB default model does not
fit), cut the model on a machine that has it and send the cut file along:

    python scripts/make_small_gguf.py --layers 8 -o smollm2-8-layers.gguf      # real weights, 47 MiB
    python scripts/gpu_check.py --model smollm2-8-layers.gguf --quick

Its tokens are not the full model's; GPU == CPU compares two runs of the same file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]     # run from a checkout without installing; gpu_probe beside us

from gpu_measure import decode_speed, engine_decode, greedy, hf_decode_speed, prefill_speed
from gpu_probe import gpu_status, model_path, tests_missing
from minitransformer.core.errors import ModelFileError
from minitransformer.kernels.checked import CHECKED_ENV

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]


@contextlib.contextmanager
def checked(on: bool):
    """Checked mode (kernels/checked.py) on or off for one part; the caller's setting comes back after it."""
    previous = os.environ.get(CHECKED_ENV)
    os.environ[CHECKED_ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[CHECKED_ENV]
        else:
            os.environ[CHECKED_ENV] = previous


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
        missing = tests_missing()
        if missing:                                 # what to add, not a failed check: the other parts still run
            return {"not_run": missing}, True
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_gpu_backend.py",
                              "tests/test_kernels.py", "tests/test_graph_runner.py"],
                             cwd=ROOT, capture_output=True, text=True, env={**os.environ, CHECKED_ENV: "1"})
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
            with checked(name == "cpu_vs_gpu"):                       # see the module docstring
                result, passed = part()
        except Exception as exc:  # recorded, not fatal: the other parts' numbers still matter
            result = {"failed": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
            passed = False
        report[name], ok = result, ok and passed
        report.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 1)
        verdict = "NOT RUN" if "not_run" in result else "ok" if passed else "FAILED"
        print(f"[{name}] {verdict} in {report['seconds'][name]:.0f} s", file=sys.stderr, flush=True)
        save(report)
    hf = report.get("hf_transformers", {}).get("tok_per_s")
    ours = report.get("engine_decode", {}).get("1", {}).get("graphs_tok_s")
    if hf and ours:
        report["target_decode_b1_graphs_over_hf"] = {"ratio": ours / hf, "target": 5.0, "met": ours / hf >= 5.0}
    return ok


def print_table(report: dict) -> None:
    gpu = report.get("gpu_status")
    if gpu:
        print(f"GPU: {gpu['device']} (compute capability {gpu['compute_capability']}), CuPy {gpu['cupy_version']} "
              f"({', '.join(gpu['cupy_distributions'])}), CUDA runtime {gpu['runtime_cuda']}, driver "
              f"{gpu['driver_cuda']}, NVRTC {gpu['nvrtc']}")
    print(f"model: {report['model']}")
    failed = [name for name, value in report.items() if isinstance(value, dict) and "failed" in value]
    for name in failed:
        print(f"{name}: FAILED {report[name]['failed']}")
    if "tests" in report and "tests" not in failed:
        tests = report["tests"]
        print(f"tests: NOT RUN: {tests['not_run']}" if "not_run" in tests else f"tests: {tests}")
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
    parser.add_argument("--model", default=None,
                        help="the GGUF file (default: $MINITRANSFORMER_MODEL, else the default model if on disk)")
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
    save = lambda r: Path(args.json).write_text(json.dumps(r, indent=2))
    try:
        args.model = report["model"] = str(model_path(args.model))           # never a download
    except ModelFileError as exc:
        print(f"gpu_check: {exc}", file=sys.stderr)
        return 2
    if args.device == "gpu":
        report["gpu_status"] = status = gpu_status()
        if status.get("warning"):
            print(f"gpu_check: warning: {status['warning']}", file=sys.stderr)
        if not status["usable"]:
            report["gpu"] = False
            save(report)
            print(f"gpu_check: no usable GPU: {status['reason']}\n  {status['hint']}", file=sys.stderr)
            print(f"wrote {args.json}")
            return 2
    report["gpu"] = args.device == "gpu"
    ok = run_gpu_parts(args, report, save)
    print_table(report)
    save(report)
    print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

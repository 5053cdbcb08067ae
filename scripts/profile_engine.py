"""Where the engine's time goes on bench serve's workload (a profile, not a test: these machines are shared).

    python scripts/profile_engine.py [--model PATH] [--num-prompts 32] [--max-tokens 48] [--max-num-seqs 16]

The workload is `minitransformer bench serve`'s default one, all requests at once (bench/serve_workload.py: slices
of 16, 64 and 200 words, max_tokens 48, ignore_eos), run through Engine(max_num_seqs=16).run() alone, no HTTP. It
prints:
1. the run's steps split into those with prefill tokens and the decode-only ones: count, seconds, ms per step;
2. the same run under cProfile (wall clock), its time attributed to the stages of a step (which function is which
   stage: STAGES), with each stage's share;
3. the floors: the workload's matmul FLOPs at this machine's measured GEMM peak (no float32 engine on these cores
   can do the matmuls faster), and one decode step's weights at its read bandwidth;
4. why a decode step at batch 16 costs more than its FLOPs say: the FFN's gate/up matmul timed at 1 to 512 rows
   (bench.machine.time_matmul_rows): OpenBLAS multiplies one row with a matrix-vector routine that streams the
   weights once, and several rows with its matrix-matrix routine, which first copies (packs) the weights into
   blocks at every call, so 4 rows cost about what 16 do.
docs/ARCHITECTURE.md ("Where the time goes") quotes a quiet run of this script.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

from rich.console import Console
from rich.table import Table

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from minitransformer import SamplingParams, load_model
from minitransformer.bench.serve_workload import make_prompts
from minitransformer.core.model import LAYER_MATRICES
from minitransformer.lab.machine import time_matmul_rows
from minitransformer.lab.measure import Probe
from minitransformer.lab.peaks import machine_profile
from minitransformer.serving.engine import Engine

# stage -> [(module path suffix, function name, "cum" | "own")]: a stage's seconds are the sum of these functions'
# cumulative (with what they call) or own (without) times. None of the "cum" functions calls another stage's.
STAGES = {
    "q/k/v matmul + RoPE": [("minitransformer/core/model.py", "project_qkv", "cum")],
    "attention: store the new K/V": [("minitransformer/core/kv_storage.py", "put", "cum")],
    "attention: gather K/V blocks": [("minitransformer/core/kv_storage.py", "get", "cum")],
    "attention: scores, softmax, sum": [("minitransformer/core/layers.py", "attention", "cum")],
    "output projection (wo) + head reshapes": [("minitransformer/core/model.py", "attention_block", "own"),
                                               ("minitransformer/serving/paged_cache.py", "attend", "own")],
    "FFN: gate/up, SiLU, down": [("minitransformer/core/layers.py", "swiglu", "cum")],
    "RMSNorms (30 x 2 + final)": [("minitransformer/core/layers.py", "rms_norm", "cum")],
    "lm_head": [("minitransformer/core/model.py", "output_logits", "own")],
    "embedding, residual adds": [("minitransformer/core/model.py", "forward", "own")],
    "sampling": [("minitransformer/serving/engine.py", "_sample", "cum")],
    "per request: detokenize, stop, stream": [("minitransformer/serving/engine.py", "append_token", "cum")],
    "schedule + step inputs": [("minitransformer/serving/scheduler.py", "schedule", "cum"),
                               ("minitransformer/serving/model_runner.py", "prepare", "cum"),
                               ("minitransformer/serving/block_manager.py", "cache_full_blocks", "cum")],
}


def run_workload(model, prompts, max_tokens: int, max_num_seqs: int) -> tuple[Engine, float]:
    """All requests at once through a fresh Engine -> (the engine, with its step_log; wall seconds of run())."""
    engine = Engine(model, max_num_seqs=max_num_seqs)
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    start = time.perf_counter()
    engine.run()
    return engine, time.perf_counter() - start


def stage_seconds(profile: cProfile.Profile) -> dict[str, float]:
    """Seconds per stage (STAGES) from a profile's per-function totals."""
    stats = pstats.Stats(profile).stats                    # (file, line, name) -> (calls, ncalls, own, cum, callers)
    seconds = {}
    for stage, functions in STAGES.items():
        total = 0.0
        for suffix, name, kind in functions:
            for (file, _, function), (_, _, own, cum, _) in stats.items():
                if function == name and file.replace(os.sep, "/").endswith(suffix):
                    total += cum if kind == "cum" else own
        seconds[stage] = total
    return seconds


def matmul_flops(model, engine: Engine) -> float:
    """The matmul FLOPs of what the engine ran: 2 per weight per token through the layers, and 2 * D * V per
    sampled row for the lm_head (attention's own products are left out: under 3% here)."""
    c = model.config
    layer_params = sum(i * o for i, o in (m.shape(c) for m in LAYER_MATRICES))   # w_qkv, wo, w_gate_up, w_down
    tokens = sum(r.num_batched_tokens for r in engine.step_log)
    sampled = engine.stats.num_generation_tokens
    return 2.0 * c.n_layers * layer_params * tokens + 2.0 * c.d_model * c.vocab_size * sampled


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    args = parser.parse_args(argv)
    console = Console(width=120)
    model = load_model(args.model)
    probe = Probe()
    prompts = make_prompts(args.num_prompts, seed=0)
    run_workload(model, prompts, args.max_tokens, args.max_num_seqs)                   # warm-up: first touches
    engine, wall = run_workload(model, prompts, args.max_tokens, args.max_num_seqs)

    console.print(f"[bold]1. The workload through Engine(max_num_seqs={args.max_num_seqs}).run(), no HTTP[/bold]: "
                  f"{args.num_prompts} requests at once, {engine.stats.num_prompt_tokens} prompt tokens, "
                  f"{engine.stats.num_generation_tokens} generated, {wall:.2f} s "
                  f"({engine.stats.num_generation_tokens / wall:.1f} output tok/s)")
    steps = Table("steps", "count", "seconds", "ms per step", "tokens per step")
    for label, chosen in (("with prefill tokens", [r for r in engine.step_log if r.num_prefill_tokens]),
                          ("decode only", [r for r in engine.step_log if not r.num_prefill_tokens])):
        seconds = sum(r.duration_s for r in chosen)
        tokens = sum(r.num_batched_tokens for r in chosen)
        steps.add_row(label, str(len(chosen)), f"{seconds:.2f}", f"{seconds / max(len(chosen), 1) * 1e3:.1f}",
                      f"{tokens / max(len(chosen), 1):.0f}")
    console.print(steps)

    profile = cProfile.Profile()
    profile.enable()
    _, profiled_wall = run_workload(model, prompts, args.max_tokens, args.max_num_seqs)
    profile.disable()
    seconds = stage_seconds(profile)
    seconds["everything else"] = max(profiled_wall - sum(seconds.values()), 0.0)
    table = Table("stage", "seconds", "share")
    for stage, value in seconds.items():
        table.add_row(stage, f"{value:.2f}", f"{value / profiled_wall:.0%}")
    console.print(f"\n[bold]2. The same run under cProfile[/bold] ({profiled_wall:.2f} s with the profiler's own "
                  "cost), by stage:")
    console.print(table)

    peaks, _ = machine_profile()
    bandwidth, gemm = peaks.read_bandwidth, peaks.gemm_peak
    flops = matmul_flops(model, engine)
    decode_bytes = model.weight_bytes                     # the tied lm_head is the embedding, counted once
    console.print(f"\n[bold]3. Floors[/bold]: this machine's GEMM peak {gemm / 1e9:.1f} GFLOP/s, read bandwidth "
                  f"{bandwidth / 1e9:.1f} GB/s. The workload's matmuls are {flops / 1e9:.0f} GFLOP: "
                  f"{flops / gemm:.2f} s at the GEMM peak, against {wall:.2f} s for the whole run "
                  f"({flops / gemm / wall:.0%}). One decode step reads every weight once: "
                  f"{decode_bytes / 2**20:.0f} MiB, {decode_bytes / bandwidth * 1e3:.1f} ms at the read bandwidth.")

    rows = (1, 4, 16, 64, 512)
    w_gate_up = model.layers[0].w_gate_up                                               # (D, 2F)
    D, cols = w_gate_up.shape
    timings = time_matmul_rows(model.xp, w_gate_up, rows, repeats=10)
    mm = Table(f"rows x (T, {D}) @ w_gate_up ({D}, {cols})", "ms (fastest)", "median", "spread", "us per row",
               "GFLOP/s")
    for T, t in timings.items():
        mm.add_row(str(T), f"{t.min * 1e3:.3f}", f"{t.median * 1e3:.3f}", f"{t.spread * 1e3:.3f}",
                   f"{t.min / T * 1e6:.1f}", f"{2 * T * D * cols / t.min / 1e9:.0f}")
    console.print("\n[bold]4. One FFN matmul against the number of rows[/bold] (timed in turns):")
    console.print(mm)
    console.print(probe.finish().line())
    return 0


if __name__ == "__main__":
    sys.exit(main())

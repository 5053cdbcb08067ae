"""What `minitransformer bench` prints and writes, from run_bench's dict only (so it can be redrawn from a JSON):

    table_rows      the cells shared by the rich table and the markdown block (one formatting, so they agree)
    runs_rows       the median and spread behind each figure, the same way
    markdown        the block for the README: results, the issue's target ratios, definitions as footnotes
    print_table     the rich table on stdout
    plot_roofline   roofline.png: the measured roof (bandwidth slope, GEMM ceiling) and every system's points
    write_outputs   bench.json, bench.md and roofline.png into one folder
"""

from __future__ import annotations

import json
from pathlib import Path

TARGET_NAMES = {"prefill_512/llama-cpp-python": "prefill 512: ours / llama-cpp-python",
                "decode_b1/hf": "decode batch 1: ours / HF",
                "decode_b1/roofline": "decode batch 1: ours / float32 roofline",
                "continuous/llama-batched-bench": "continuous batching (16 req.): ours / llama.cpp's batched decode "
                                                  "(llama-batched-bench)"}

FOOTNOTES = """\
Definitions (each figure: the best of the kept runs after one warm-up per system, the one nearest to a quiet machine;
the runs table gives the median and the spread; systems alternate run by run; a ratio marked "(within noise)" divides
two figures whose runs overlap, so this run does not show which system is faster):
- prefill P: P / seconds of one prefill of a P-token slice of a real text (ours: prefill.prefill on a fresh KVCache;
  HF: one model(ids, use_cache=True) under no_grad; llama-cpp-python: reset() + eval(ids)).
- decode batch B: B * N / seconds of N greedy steps after a prefill that is not timed (ours: decode_step with the
  argmax on the host; HF: B * N / (t(generate N+1) - t(generate 1)); llama-cpp-python: single-token evals, batch 1
  only; llama-batched-bench: llama.cpp's own batched decode, its S_TG = B * N / t_tg for B prompts of P tokens).
- generate with / without cache: seconds of one greedy generate() of the same prompt and new tokens; our tokens are
  checked equal (a mismatch voids the run); "no cache / cache" is their ratio.
- continuous: ours: all generated tokens / wall time (prefill included) of the requests through
  Engine(policy="continuous"); llama-batched-bench: as many prompts at once, each of our prompts' mean length (the
  same prefill work), N - 1 decode steps after the prefill's first token: B * N / (t_pp + t_tg), in the same rounds.
  Also compared with our batch-1 decode.
- roofline: prefill P / max(FLOPs / GEMM peak, bytes / read bandwidth) with forward_cost; decode
  B / max(FLOPs / peak, (weight bytes + KV bytes at the mean context) / read bandwidth), the machine profile.
  roofline.png places every system at our float32 step's intensity; llama.cpp (both peers) reads its quantized
  weights (fewer bytes per token), so its decode points can sit above the float32 bandwidth roof."""


def _label(row: dict, settings: dict) -> str:
    w, n = row["workload"], row["size"]
    if w == "prefill":
        return f"prefill {n} tokens (tok/s)"
    if w == "decode":
        return f"decode batch {n} (tok/s)"
    tokens = f"{settings['cache_prompt_tokens']}+{settings['cache_new_tokens']} tokens"
    if w == "generate_cache":
        return f"generate with cache, {tokens} (s)"
    if w == "generate_no_cache":
        return f"generate without cache, {tokens} (s)"
    return f"continuous, {n} requests x {settings['continuous_tokens']} tokens (tok/s)"


NOISE = " (within noise)"


def ratio_cell(entry: dict | None) -> str:
    """'1.23x', or '1.05x (within noise)' when the two systems' runs overlap; 'n/a' without the ratio."""
    if entry is None:
        return "n/a"
    return fmt(entry["value"], "x") + ("" if entry.get("beyond_noise", True) else NOISE)


def fmt(value, unit: str) -> str:
    """The one number format of the table and the markdown: tok/s 1 decimal, seconds 3, ratios 2 and an x."""
    if value is None:
        return "n/a"
    return {"tok/s": f"{value:.1f}", "s": f"{value:.3f}", "x": f"{value:.2f}x"}[unit]


def columns(data: dict) -> tuple[list[str], list[str]]:
    """(value columns: systems + roofline, ratio columns: ours / each other one)."""
    values = list(data["systems"]) + ["roofline"]
    return values, [v for v in values if v != "ours"]


def table_rows(data: dict) -> list[list[str]]:
    """One list of cells per result row, plus the cache speed-up row: workload, values..., ours / x..."""
    values, others = columns(data)
    ratio = {r["id"]: r for r in data["ratios"]}
    out = []
    for key, row in data["rows"].items():
        cells = [_label(row, data["settings"])] + [fmt(row["values"].get(v), row["unit"]) for v in values]
        cells += [ratio_cell(ratio.get(f"{key}/{o}")) for o in others]
        out.append(cells)
    speedups = [ratio_cell(ratio.get(f"cache_speedup/{v}")) for v in values]
    out.append(["cache speed-up: no cache / cache seconds"] + speedups + ["n/a"] * len(others))
    return out


def runs_rows(data: dict) -> list[list[str]]:
    """Per result row and system: 'median M, spread S%' of its kept runs (spread = max / min - 1)."""
    out = []
    for row in data["rows"].values():
        cells = [_label(row, data["settings"])]
        for system in data["systems"]:
            if system in row.get("medians", {}):
                cells.append(f"median {fmt(row['medians'][system], row['unit'])}, "
                             f"spread {(row['spread'][system] - 1) * 100:.0f}%")
            else:
                cells.append("n/a")
        out.append(cells)
    return out


def quietness_note(data: dict) -> str:
    """The probe's line, and on a busy run what that means for the figures."""
    q = data.get("quietness")
    if not q:
        return "quietness: not probed"
    if q["quiet"]:
        return q["line"]
    return (f"{q['line']}. The machine was busy ({q['why_busy']}): these figures are not a quiet machine's and "
            "their ratios may not hold there; close other programs and rerun.")


def target_rows(data: dict) -> list[list[str]]:
    ratio = {r["id"]: r for r in data["ratios"]}
    out = []
    for rid, name in TARGET_NAMES.items():
        r = ratio.get(rid)
        target = f">= {fmt(r['target'], 'x')}" if r else "n/a"
        met = ("yes" if r["meets"] else "no") if r else "n/a (peer missing)"
        out.append([name, ratio_cell(r), target, met])
    out.append(["continuous batching: ours / our batch-1 decode", ratio_cell(ratio.get("continuous/ours_decode_b1")),
                "", ""])
    return out


def markdown(data: dict) -> str:
    values, others = columns(data)
    m = data["machine"]
    lines = [f"### minitransformer bench: {Path(data['model']).name}", "",
             f"Measured on {m['label']}: read bandwidth {m['read_bandwidth_bytes_s'] / 1e9:.1f} GB/s, copy "
             f"{m['copy_bandwidth_bytes_s'] / 1e9:.1f} GB/s (read + write), "
             f"float32 GEMM {m['gemm_flops'] / 1e9:.1f} GFLOP/s; numpy {m['numpy']}, torch {m['torch']}, "
             f"transformers {m['transformers']}, llama-cpp-python {m['llama_cpp']}; the best of "
             f"{data['settings']['repeats']} runs per figure.", "", quietness_note(data), ""]
    header = ["workload"] + values + [f"ours / {o}" for o in others]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in table_rows(data)]
    lines += ["", "Targets the project set itself (measured, not tuned for):", "", "| ratio | value | target | met |",
              "|---|---:|---:|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in target_rows(data)]
    lines += ["", "The runs behind each figure (median, and spread = slowest / fastest - 1):", "",
              "| workload | " + " | ".join(data["systems"]) + " |", "|---|" + "---:|" * len(data["systems"])]
    lines += ["| " + " | ".join(cells) + " |" for cells in runs_rows(data)]
    missing = [f"{name}: {p['reason']}" for name, p in data["peers"].items() if not p["available"]]
    if missing:
        lines += ["", "Peers not measured: " + "; ".join(missing) + "."]
    noisy = noisy_rows(data)
    if noisy:
        lines += ["", f"Noisy (kept runs differ by more than {NOISY}x, the machine was busy; rerun): "
                  + ", ".join(noisy) + "."]
    return "\n".join(lines + ["", FOOTNOTES, ""])


NOISY = 1.5


def noisy_rows(data: dict) -> list[str]:
    """"row (system max/min)" for every system whose kept runs spread more than NOISY."""
    return [f"{key} {name} {spread:.1f}x" for key, row in data["rows"].items()
            for name, spread in row.get("spread", {}).items() if spread > NOISY]


def print_table(data: dict, console) -> None:
    from rich.table import Table

    values, others = columns(data)
    table = Table(title=f"minitransformer bench: {Path(data['model']).name}", title_justify="left")
    for name in ["workload"] + values + [f"ours / {o}" for o in others]:
        table.add_column(name, justify="left" if name == "workload" else "right")
    for cells in table_rows(data):
        table.add_row(*cells)
    console.print(table)
    targets = Table(title="targets (measured, not tuned for)", title_justify="left")
    for name in ("ratio", "value", "target", "met"):
        targets.add_column(name, justify="left" if name == "ratio" else "right")
    for cells in target_rows(data):
        targets.add_row(*cells)
    console.print(targets)
    runs = Table(title="the runs behind each figure: median, spread (slowest / fastest - 1)", title_justify="left")
    for name in ["workload"] + list(data["systems"]):
        runs.add_column(name, justify="left" if name == "workload" else "right")
    for cells in runs_rows(data):
        runs.add_row(*cells)
    console.print(runs)
    console.print(quietness_note(data), markup=False, highlight=False)
    for name, p in data["peers"].items():
        if not p["available"]:
            console.print(f"peer {name} not measured: {p['reason']}")
    if noisy_rows(data):
        console.print(f"noisy rows (max / min of runs > {NOISY}x; rerun on a quiet machine): "
                      + ", ".join(noisy_rows(data)))


def plot_roofline(data: dict, path: Path) -> None:
    """Log-log roofline: achieved GFLOP/s = a step's FLOPs / its seconds, at the step's arithmetic intensity."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    m = data["machine"]
    bw, peak = m["read_bandwidth_bytes_s"], m["gemm_flops"]
    rows = [r for r in data["rows"].values() if r["workload"] in ("prefill", "decode")]
    xs = [r["intensity"] for r in rows] + [peak / bw]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    x = np.geomspace(min(xs) / 3, max(xs) * 3, 200)
    ax.plot(x, np.minimum(peak, bw * x) / 1e9, "k-", label=f"roof: {bw / 1e9:.1f} GB/s, {peak / 1e9:.1f} GFLOP/s")
    ax.axvline(peak / bw, color="grey", linestyle=":", label=f"ridge {peak / bw:.3g} FLOP/byte")
    for system, color in zip(data["systems"], ("C0", "C1", "C2", "C3")):
        for workload, marker in (("prefill", "o"), ("decode", "s")):
            pts = [(r["intensity"], r["flops"] * r["values"][system] / r["size"] / 1e9, r["size"])
                   for r in rows if r["workload"] == workload and system in r["values"]]
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color=color, linestyle="none",
                    label=f"{system} {workload}")
            if system == "ours":
                for xi, yi, size in pts:
                    ax.annotate(f"{'P' if workload == 'prefill' else 'B'}={size}", (xi, yi), fontsize=7,
                                textcoords="offset points", xytext=(4, -9))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity of our float32 step (FLOP per byte moved, forward_cost); peers at the same x")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(f"Roofline: {Path(data['model']).stem}\nmeasured on {m['label']}", fontsize=10)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_outputs(data: dict, out: Path, json_path: Path | None = None) -> dict[str, Path]:
    """bench.json (or json_path), bench.md and roofline.png -> their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": json_path or out / "bench.json", "markdown": out / "bench.md", "figure": out / "roofline.png"}
    paths["json"].parent.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(data, indent=2) + "\n")
    paths["markdown"].write_text(markdown(data))
    plot_roofline(data, paths["figure"])
    return paths

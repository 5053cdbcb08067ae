"""What `minitransformer bench serve` computes from its records, prints and writes.

    percentile      linear interpolation between closest ranks (numpy's default, as vLLM's benchmark uses)
    is_good         one request within the SLO: TTFT, TPOT (and E2EL if set) each at most its bound
    summarize       one rate's records -> counts, throughputs, goodput, p50/p90/p99 of TTFT, TPOT, ITL, E2EL
    ratios          ours / each peer that ran, at each rate (one run each per rate, in turns)
    print_tables    the rich tables: one row per (server, rate), then the ratios
    plot            TTFT p50/p99 and output tokens/s against request rate, one line per server
    write_outputs   serve.json (settings, summaries, every request) and serve.png

Definitions as in vLLM's benchmark (vllm/benchmarks/serve.py, calculate_metrics, in github.com/vllm-project/vllm):
throughputs are completed requests or output tokens over the wall time of the run; goodput is the completed
requests that met every SLO, over the same wall time; ITL percentiles pool every gap of every request.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..core.metrics import percentile
from ..lab.measure import Timing

PCTS = (50, 90, 99)


def is_good(record, s) -> bool:
    """vLLM's goodput test: each SLO set must hold. A one-token answer has no TPOT and counts as 0."""
    if not record.ok:
        return False
    checks = [(record.ttft_s, s.slo_ttft_ms), (record.tpot_s or 0.0, s.slo_tpot_ms), (record.e2el_s, s.slo_e2el_ms)]
    return all(value * 1000.0 <= bound for value, bound in checks if bound is not None)


def _stats_ms(values) -> dict:
    values = [v * 1000.0 for v in values if v is not None]
    out = {f"p{q}": percentile(values, q) for q in PCTS}
    out["mean"] = float(np.mean(values)) if values else None
    return out


def summarize(records, wall_s: float, s) -> dict:
    """One rate's numbers. Failed requests are counted and their errors kept; they add no latency samples."""
    done = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error] = errors.get(r.error, 0) + 1
    out_tokens = sum(r.output_tokens for r in done)
    return {
        "requests": len(records), "completed": len(done), "failed": len(records) - len(done), "errors": errors,
        "wall_s": wall_s, "output_tokens": out_tokens,
        "prompt_tokens": sum(r.prompt_tokens or 0 for r in done) if all(r.prompt_tokens for r in done) else None,
        # The usage chunk is exact; without it a content chunk is counted as one token.
        "tokens_counted_from": (None if not done else "usage" if all(r.usage_reported for r in done)
                                else "chunks" if not any(r.usage_reported for r in done) else "mixed"),
        "request_throughput": len(done) / wall_s, "output_throughput": out_tokens / wall_s,
        "goodput": sum(is_good(r, s) for r in records) / wall_s,
        "ttft_ms": _stats_ms(r.ttft_s for r in done), "tpot_ms": _stats_ms(r.tpot_s for r in done),
        "itl_ms": _stats_ms(gap for r in done for gap in r.itl_s), "e2el_ms": _stats_ms(r.e2el_s for r in done),
    }


def build_result(sweeps: dict, s, note: str | None = None, quiet=None) -> dict:
    """The JSON document: settings, the run's quietness (a measure.Quietness, or None when not probed), and per
    server its model and, per rate, the summary and every request."""
    from dataclasses import asdict

    servers = {}
    for name, sweep in sweeps.items():
        runs = [{"request_rate": _rate_json(run["rate"]), "summary": summarize(run["records"], run["wall_s"], s),
                 "records": [r.to_json() for r in run["records"]]} for run in sweep["runs"]]
        servers[name] = {"url": sweep["url"], "model": sweep["model"], "endpoint": sweep["endpoint"], "runs": runs,
                         "exited": sweep.get("exited"), "command": sweep.get("command")}
    settings = asdict(s) | {"rates": [_rate_json(r) for r in s.rates]}
    per_run = ratios(servers)
    result = {"schema": "minitransformer-bench-serve/1", "settings": settings, "servers": servers,
              "ratios": per_run, "ratio_spread": ratio_spread(per_run)}
    if quiet is not None:
        result["quietness"] = {"line": quiet.line(), "quiet": quiet.quiet, "why_busy": quiet.why_busy()}
    if note:
        result["note"] = note
    return result


def _rate_json(rate: float):
    return "inf" if math.isinf(rate) else rate


# The peers' names, exactly as serve.json and the tables print them (serve_compare.py starts them).
LLAMA_CPP_PYTHON = "llama-cpp-python's server"      # one request at a time
LLAMA_SERVER = "llama.cpp's llama-server"           # parallel slots, continuous batching
VLLM_BINDING_WORDS = {"default": "vLLM's core binding", "all-cores": "all cores for compute"}


def vllm_name(mode: str, binding: str) -> str:
    """vLLM's CPU build with how it ran: "vLLM's CPU build (eager, all cores for compute)"."""
    return f"vLLM's CPU build ({mode}, {VLLM_BINDING_WORDS[binding]})"


def ratios(servers: dict) -> list[dict]:
    """Per peer and rate, ours / that peer: output tokens/s (above 1: ours higher) and TTFT p99 (below 1: ours
    lower). One run of each per rate: a ratio has no spread of its own, so it says what this run measured, not a
    margin."""
    if "ours" not in servers:
        return []
    out = []
    for peer in [name for name in servers if name != "ours"]:
        for a, b in zip(servers["ours"]["runs"], servers[peer]["runs"]):
            sa, sb = a["summary"], b["summary"]
            ttft_a, ttft_b = sa["ttft_ms"]["p99"], sb["ttft_ms"]["p99"]
            out.append({"peer": peer, "request_rate": a["request_rate"],
                        "output_throughput": sa["output_throughput"] / sb["output_throughput"]
                        if sb["output_throughput"] else None,
                        "ttft_p99": ttft_a / ttft_b if ttft_a is not None and ttft_b else None})
    return out


def ratio_spread(per_run: list[dict]) -> list[dict]:
    """Per peer and rate that ran more than once (--repeats): the median, lowest and highest of its per-run ratios.

    Each ratio pairs ours with the peer in the same turn at that rate, so it is taken between two runs close in
    time; how far the ratios of N turns spread is how much one comparison on this machine can be trusted. The
    median is what to quote; a target is met for sure only when the lowest meets it.
    """
    groups: dict[tuple, list[dict]] = {}
    for row in per_run:
        groups.setdefault((row["peer"], row["request_rate"]), []).append(row)
    out = []
    for (peer, rate), rows in groups.items():
        if len(rows) < 2:
            continue
        entry: dict = {"peer": peer, "request_rate": rate, "runs": len(rows)}
        for key in ("output_throughput", "ttft_p99"):
            timing = Timing(tuple(row[key] for row in rows if row[key] is not None))
            entry[key] = {"median": timing.median, "min": timing.min, "max": timing.max} if timing.samples else None
        out.append(entry)
    return out


def _f(value, digits: int = 0) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _rate_label(rate) -> str:
    return rate if isinstance(rate, str) else f"{rate:g}"


def _ratio(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _spread(stats: dict | None) -> str:
    return "n/a" if stats is None else f"{stats['median']:.2f}x ({stats['min']:.2f}-{stats['max']:.2f})"


def _trio(stats: dict) -> str:
    return " / ".join(_f(stats[f"p{q}"]) for q in PCTS)


def print_tables(result: dict, console) -> None:
    """One row per server and rate; then, if both servers ran, the ratios."""
    from rich.table import Table

    s = result["settings"]
    slo = f"TTFT <= {s['slo_ttft_ms']:g} ms, TPOT <= {s['slo_tpot_ms']:g} ms"
    if s["slo_e2el_ms"] is not None:
        slo += f", E2EL <= {s['slo_e2el_ms']:g} ms"
    table = Table(title=f"bench serve: {s['num_prompts']} prompts per rate, max_tokens {s['max_tokens']}, "
                        f"endpoint {s['endpoint']}; goodput SLO: {slo}", title_justify="left")
    for name in ("server", "rate (req/s)", "ok", "failed", "req/s", "out tok/s", "goodput (req/s)",
                 "TTFT ms p50/p90/p99", "TPOT ms p50/p90/p99", "ITL ms p50/p90/p99", "E2EL ms p50/p90/p99"):
        table.add_column(name, justify="left" if name == "server" else "right")
    for server, data in result["servers"].items():
        for run in data["runs"]:
            m = run["summary"]
            table.add_row(server, _rate_label(run["request_rate"]), str(m["completed"]), str(m["failed"]),
                          _f(m["request_throughput"], 2), _f(m["output_throughput"], 1), _f(m["goodput"], 2),
                          _trio(m["ttft_ms"]), _trio(m["tpot_ms"]), _trio(m["itl_ms"]), _trio(m["e2el_ms"]))
    console.print(table)
    for server, data in result["servers"].items():
        if data.get("exited"):
            console.print(f"[red]{server} server {data['exited']}[/red]")
        for run in data["runs"]:
            for error, count in run["summary"]["errors"].items():
                console.print(f"[red]{server} at rate {_rate_label(run['request_rate'])}: {count} failed: "
                              f"{error}[/red]")
    if result["ratios"]:
        ratio_table = Table(title="ours / each peer", title_justify="left")
        for name in ("peer", "rate (req/s)", "out tok/s (above 1: ours higher)", "TTFT p99 (below 1: ours lower)"):
            ratio_table.add_column(name, justify="left" if name == "peer" else "right")
        for row in result["ratios"]:
            ratio_table.add_row(row["peer"], _rate_label(row["request_rate"]), _ratio(row["output_throughput"]),
                                _ratio(row["ttft_p99"]))
        console.print(ratio_table)
        if result.get("ratio_spread"):
            spread_table = Table(title="ours / each peer over the repeats: median (lowest-highest)",
                                 title_justify="left")
            for name in ("peer", "rate (req/s)", "runs", "out tok/s", "TTFT p99"):
                spread_table.add_column(name, justify="left" if name == "peer" else "right")
            for row in result["ratio_spread"]:
                spread_table.add_row(row["peer"], _rate_label(row["request_rate"]), str(row["runs"]),
                                     _spread(row["output_throughput"]), _spread(row["ttft_p99"]))
            console.print(spread_table)
        else:
            console.print("one run of each server per rate, the servers in turns: a ratio has no spread of its own; "
                          "--repeats N measures how much it moves")
    if result.get("note"):
        console.print(result["note"], markup=False, highlight=False)
    q = result.get("quietness")
    if q:
        console.print(q["line"] + ("" if q["quiet"] else f". The machine was busy ({q['why_busy']}): these "
                                   "numbers are not a quiet machine's; close other programs and rerun."),
                      markup=False, highlight=False)


def plot(result: dict, path: Path) -> Path:
    """Two panels against request rate (evenly spaced, in the order given): TTFT p50 (solid) and p99 (dashed); out
    tok/s. A rate run several times (--repeats) is drawn at the median of its runs, each run a faint dot."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = list(dict.fromkeys(result["settings"]["rates"]))      # each rate once (--repeats runs it again)
    labels = [_rate_label(r) for r in rates]
    x = list(range(len(labels)))
    fig, (ax_ttft, ax_tput) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (server, data) in enumerate(result["servers"].items()):
        color = f"C{i}"
        by_rate: dict = {rate: [] for rate in rates}                  # rate -> the summaries of its runs
        for run in data["runs"]:
            by_rate[run["request_rate"]].append(run["summary"])
        for q, style in (("p50", "-"), ("p99", "--")):
            _plot_runs(ax_ttft, x, [[np.nan if m["ttft_ms"][q] is None else m["ttft_ms"][q] for m in by_rate[rate]]
                                    for rate in rates], style, color, f"{server} TTFT {q}")
        _plot_runs(ax_tput, x, [[m["output_throughput"] for m in by_rate[rate]] for rate in rates], "-", color,
                   server)
    for ax, ylabel in ((ax_ttft, "time to first token (ms)"), (ax_tput, "output tokens/s")):
        ax.set_xticks(x, labels)
        ax.set_xlabel("request rate (requests/s, Poisson arrivals)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    ax_ttft.set_yscale("log")
    s = result["settings"]
    fig.suptitle(f"bench serve: {s['num_prompts']} prompts per rate, {s['max_tokens']} max tokens, "
                 f"{s['endpoint']} endpoint")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _plot_runs(ax, x, runs: list[list[float]], style: str, color: str, label: str) -> None:
    """One line through the median of each rate's runs; where a rate ran more than once, each run as a faint dot."""
    medians = [percentile([y for y in ys if not np.isnan(y)], 50) for ys in runs]
    ax.plot(x, [np.nan if m is None else m for m in medians], style, marker="o", color=color, label=label)
    for xi, ys in zip(x, runs):
        if len(ys) > 1:
            ax.plot([xi] * len(ys), ys, ".", color=color, alpha=0.35)


def write_outputs(result: dict, out_dir: Path, json_path: Path | None = None) -> dict[str, Path]:
    """serve.json (or json_path) and serve.png in out_dir -> their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = json_path or out_dir / "serve.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    return {"json": json_path, "figure": plot(result, out_dir / "serve.png")}

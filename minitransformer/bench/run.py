"""`minitransformer bench`: this machine's peaks, then every workload on us and on the installed peers.

Order of work: the machine profile first (read and copy bandwidth, GEMM FLOP/s: peaks.py), then each workload.
Inside a workload the systems alternate, so a slow spell of this shared machine hits all of them alike: one warm-up
call per system (dropped), then for repeat r = 1..R: ours, hf, llama-cpp-python, llama-batched-bench. The R kept
runs of a system are a measure.Timing (a rate r counts as 1/r seconds per unit of work); its figure is the best run,
the one nearest to a quiet machine (noise only ever adds time), with the median and the spread kept next to it:

    prefill P       runs are seconds; tok/s = P / min(seconds)      (median: P / median(seconds))
    decode B        runs are tok/s (B * N / decode seconds); the highest of them
    generate        runs are seconds of generate() with / without the cache; the lowest of them
    continuous      runs are tok/s (all generated tokens / wall time); the highest of them

A ratio of two systems is "beyond noise" only when their runs do not overlap (every run of one beats every run of
the other); otherwise this run cannot say which is faster, and report.py says so next to the ratio. A measure.Probe
watches the whole run: other programs' CPU share and a calibration matmul at both ends (measure.py).

Rooflines (the best this machine allows, from its measured peaks):
    prefill P       P / max(flops / peak FLOP/s, bytes / read bandwidth), flops and bytes from forward_cost(cfg, P)
    decode B        B / max(flops / peak FLOP/s, (weight bytes + KV bytes of B sequences at context S)
                    / read bandwidth),
                    S = prompt + N/2 (the mean context of the timed steps); at B = 1 this is roofline_tokens_per_s

run_bench returns one dict (the JSON of bench.json): machine, peers, settings, quietness, rows (raw runs, figures,
medians) and ratios (each naming the two numbers it divides, so a reader, and the test, can recompute it). Each row
also has "spread" per system, max / min of its kept runs: report.py flags rows above NOISY, where the machine was busy.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from dataclasses import asdict, dataclass, replace

from ..core.errors import InputError
from ..core.kv_cache import estimate_kv_bytes
from ..lab.machine import forward_cost
from ..lab.measure import Probe, Timing
from ..lab.peaks import machine_label, machine_profile
from .workloads import Ours, prompt_ids, serving_prompts

SCHEMA = 2                                # 2: figures are the best run, with "medians" and ratios' "beyond_noise"


@dataclass(frozen=True)
class Settings:
    """What one run measures. DEFAULT takes ~5 minutes on 2 cores with both peers; QUICK well under a minute."""
    prefill_lengths: tuple[int, ...] = (32, 128, 512, 1024)
    batches: tuple[int, ...] = (1, 4, 16, 64)
    decode_prompt_tokens: int = 32        # each decode row's prompt length (all B rows the same text)
    decode_tokens: int = 32               # N timed decode steps
    cache_prompt_tokens: int = 32         # cache vs no-cache: prompt and new tokens of one generate()
    cache_new_tokens: int = 32
    continuous_requests: int = 16
    continuous_tokens: int = 64
    repeats: int = 3
    copy_bytes: int = 256 * 2**20         # the machine profile's copy; its read stream is twice as large
    settle_s: float = 0.2                 # idle pause before each timed call (see alternate)


DEFAULT = Settings()
QUICK = Settings(prefill_lengths=(32, 128), batches=(1, 4), decode_prompt_tokens=16, decode_tokens=8,
                 cache_prompt_tokens=16, cache_new_tokens=8, continuous_requests=16, continuous_tokens=8,
                 copy_bytes=64 * 2**20)

# The issues' targets: (ratio id, target). The lead checks them; nothing here is tuned for them. Continuous batching
# is held to issue 28's bar against llama.cpp's batched server (1.25x), here against its batched decode.
TARGETS = {"prefill_512/llama-cpp-python": 2.0, "decode_b1/hf": 3.0, "decode_b1/roofline": 0.9,
           "continuous/llama-batched-bench": 1.25}


def check_settings(s: Settings, context_length: int) -> None:
    """One-line errors for values no run can use, before anything is measured."""
    if s.repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {s.repeats}")
    if not s.prefill_lengths or not s.batches:
        raise InputError("--prefill-lengths and --batches need at least one value each")
    for p in s.prefill_lengths:
        if not 1 <= p <= context_length:
            raise InputError(f"prefill length {p} must be in [1, {context_length}] (the model's context)")
    for b in s.batches:
        if not 1 <= b <= 256:
            raise InputError(f"batch {b} must be in [1, 256]")
    for prompt, new in ((s.decode_prompt_tokens, s.decode_tokens), (s.cache_prompt_tokens, s.cache_new_tokens)):
        if prompt < 1 or new < 1 or prompt + new + 1 > context_length:
            raise InputError(f"a {prompt}-token prompt + {new} new tokens must fit the context of {context_length}")


def machine_info(peaks: dict, systems) -> dict:
    """Where the numbers were measured: cores, BLAS threads if knowable, library versions, the machine profile."""

    def version(dist: str):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    blas = next((os.environ[v] for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
                 if os.environ.get(v)), None)
    info = {"label": machine_label(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": version("numpy"), "numpy_blas_threads": blas,
            "torch": version("torch"), "transformers": version("transformers"),
            "llama_cpp": version("llama_cpp_python") or version("llama-cpp-python"), **peaks}
    for system in systems:
        if hasattr(system, "versions"):
            info.update(system.versions())
    return info


def alternate(systems, call, repeats: int, tick, settle_s: float = 0.0) -> dict[str, list[float]]:
    """One warm-up call per system (dropped), then `repeats` rounds of ours, hf, llama.cpp... -> runs per system.

    settle_s: seconds of idle before each timed call. The thread pools of all three systems (OpenBLAS, torch's
    OpenMP, ggml) spin-wait for a while after a call ends, so a system timed right after another shares the cores
    with its predecessor's spinning threads and is measured slower than it is.
    """
    for system in systems:
        call(system)
        tick()
    runs: dict[str, list[float]] = {system.name: [] for system in systems}
    for _ in range(repeats):
        for system in systems:
            time.sleep(settle_s)
            runs[system.name].append(call(system))
            tick()
    return runs


def as_timing(runs: list[float], runs_unit: str) -> Timing:
    """A system's kept runs as a measure.Timing in seconds: a rate of r tok/s is 1/r seconds per token."""
    return Timing(tuple(runs) if runs_unit == "s" else tuple(1 / r for r in runs))


def figure(seconds: float, row: dict) -> float:
    """The row's figure for a run of `seconds` (as_timing's units): P / seconds for prefill, the rate for tok/s
    runs, the seconds themselves for generate."""
    if row["runs_unit"] == "tok/s":
        return 1 / seconds
    return row["size"] / seconds if row["unit"] == "tok/s" else seconds


def summarize(row: dict) -> dict:
    """Fill a row's figures from its raw runs: values (the best run), medians and spread (max / min) per system."""
    for name, runs in row["runs"].items():
        timing = as_timing(runs, row["runs_unit"])
        row.setdefault("values", {})[name] = figure(timing.min, row)
        row.setdefault("medians", {})[name] = figure(timing.median, row)
        row.setdefault("spread", {})[name] = max(runs) / min(runs)
    return row


def figure_range(row: dict, system: str) -> tuple[float, float]:
    """(lowest, highest) figure over a system's kept runs; a computed figure (the roofline) is a single point."""
    if system not in row.get("runs", {}):
        value = row["values"][system]
        return value, value
    figures = [figure(t, row) for t in as_timing(row["runs"][system], row["runs_unit"]).samples]
    return min(figures), max(figures)


def beyond_noise(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two figures' (lowest, highest) ranges of runs do not overlap: only then does their ratio say which is
    faster (report.py marks the others "within noise")."""
    return a[0] > b[1] or a[1] < b[0]


def run_bench(model, systems, settings: Settings = DEFAULT, peers: dict | None = None, progress=None,
              peaks: dict | None = None) -> dict:
    """Measure everything; `systems` is [Ours(model), *available peers]; progress: a rich Progress or None.

    peers: {name: {"available": bool, "reason": str | None}} for the JSON. peaks: {"read_bandwidth_bytes_s",
    "copy_bandwidth_bytes_s", "gemm_flops"} to skip measuring them (tests); otherwise the machine profile, from
    $MINITRANSFORMER_MACHINE_PROFILE when a set of runs measured it once (peaks.machine_profile)."""
    s, cfg, tokenizer = settings, model.config, model.tokenizer
    check_settings(s, cfg.context_length)
    wb = model.weight_bytes
    names = [x.name for x in systems]

    def count(workload, sizes=(1,)):
        return sum(x.supports(workload, b) for x in systems for b in sizes) * (s.repeats + 1)
    total = (count("prefill") * len(s.prefill_lengths) + count("decode", s.batches) + 2 * count("generate")
             + count("continuous") + 1)
    task = progress.add_task("machine peaks", total=total) if progress else None

    def stage(text):
        if progress:
            progress.update(task, description=text)
        return (lambda: progress.advance(task)) if progress else (lambda: None)

    probe = Probe()                           # is the machine quiet? (~0.2 s here and at the end)
    tick = stage("machine profile (read, copy, GEMM)")
    if peaks is None:
        profile, _ = machine_profile(copy_bytes=s.copy_bytes)
        peaks = {"read_bandwidth_bytes_s": profile.read_bandwidth, "copy_bandwidth_bytes_s": profile.copy_bandwidth,
                 "gemm_flops": profile.gemm_peak, "profile": profile.to_json(), "profile_line": profile.line()}
    tick()
    bw, peak = peaks["read_bandwidth_bytes_s"], peaks["gemm_flops"]
    rows = {}

    for p in s.prefill_lengths:
        ids = prompt_ids(tokenizer, p)
        tick = stage(f"prefill {p} tokens")
        live = [x for x in systems if x.supports("prefill")]
        runs = alternate(live, lambda x, ids=ids: x.prefill_seconds(ids), s.repeats, tick, s.settle_s)
        cost = forward_cost(cfg, p, weight_bytes=wb)
        row = summarize(dict(workload="prefill", size=p, unit="tok/s", runs_unit="s", runs=runs,
                             flops=cost.flops, bytes=cost.bytes, intensity=cost.intensity))
        row["values"]["roofline"] = p / max(cost.flops / peak, cost.bytes / bw)
        rows[f"prefill_{p}"] = row

    ids = prompt_ids(tokenizer, s.decode_prompt_tokens)
    context = s.decode_prompt_tokens + s.decode_tokens // 2                # mean context of the timed steps
    for b in s.batches:
        tick = stage(f"decode batch {b}")
        live = [x for x in systems if x.supports("decode", b)]
        runs = alternate(live, lambda x, b=b: x.decode_tok_s(b, ids, s.decode_tokens), s.repeats, tick, s.settle_s)
        cost = forward_cost(cfg, 1, context, batch=b, weight_bytes=wb)
        row = summarize(dict(workload="decode", size=b, unit="tok/s", runs_unit="tok/s", runs=runs,
                             flops=cost.flops, bytes=cost.bytes, intensity=cost.intensity))
        row["values"]["roofline"] = b / max(cost.flops / peak, (wb + estimate_kv_bytes(cfg, context, b)) / bw)
        rows[f"decode_b{b}"] = row

    ids = prompt_ids(tokenizer, s.cache_prompt_tokens)
    tokens: dict[tuple[str, bool], list] = {}

    def timed(x, use_cache):
        seconds, out = x.generate_seconds(ids, s.cache_new_tokens, use_cache)
        tokens.setdefault((x.name, use_cache), out)
        return seconds
    for use_cache, workload in ((True, "generate_cache"), (False, "generate_no_cache")):
        tick = stage("generate " + ("with" if use_cache else "without") + " the cache")
        live = [x for x in systems if x.supports("generate")]
        runs = alternate(live, lambda x, use_cache=use_cache: timed(x, use_cache), s.repeats, tick, s.settle_s)
        rows[workload] = summarize(dict(workload=workload, size=s.cache_new_tokens, unit="s", runs_unit="s",
                                        runs=runs))
    equal = {name: tokens.get((name, True)) == tokens.get((name, False)) for name in rows["generate_cache"]["runs"]}
    if not equal.get("ours", True):
        raise RuntimeError("our tokens with and without the KV cache differ: the benchmark is void")
    rows["generate_cache"]["tokens_equal"] = equal

    room = cfg.context_length - s.continuous_tokens                         # a small model's context cuts prompts
    prompts = [tokenizer.encode(t)[:room] for t in serving_prompts(s.continuous_requests)]
    tick = stage(f"continuous batching, {s.continuous_requests} requests")
    live = [x for x in systems if x.supports("continuous")]
    runs = alternate(live, lambda x: x.continuous_tok_s(prompts, s.continuous_tokens), s.repeats, tick, s.settle_s)
    rows["continuous"] = summarize(dict(workload="continuous", size=s.continuous_requests, unit="tok/s",
                                        runs_unit="tok/s", runs=runs))
    stage("done")
    quiet = probe.finish()
    return {"schema": SCHEMA, "model": str(model.path), "weight_bytes": wb,
            "machine": machine_info(peaks, systems), "peers": peers or {}, "systems": names,
            "settings": asdict(s),
            "quietness": {"line": quiet.line(), "quiet": quiet.quiet, "why_busy": quiet.why_busy()},
            "rows": rows, "ratios": ratios(rows, names)}


def ratios(rows: dict, names: list[str]) -> list[dict]:
    """Every ours / peer and ours / roofline, the cache speed-up, and continuous batching against each peer that
    runs it and against our own batch-1 decode.

    Each entry: id, num [row, system], den [row, system], value = num / den, beyond_noise (the two figures' runs do
    not overlap), and target and meets when the issue sets one. For rows in seconds (generate) the ratio is
    peer-style "no cache / cache" seconds: how much the cache saves."""
    out = []

    def add(rid, num, den):
        a, b = rows.get(num[0], {}).get("values", {}), rows.get(den[0], {}).get("values", {})
        if num[1] not in a or den[1] not in b:
            return
        entry = {"id": rid, "num": list(num), "den": list(den), "value": a[num[1]] / b[den[1]],
                 "beyond_noise": beyond_noise(figure_range(rows[num[0]], num[1]), figure_range(rows[den[0]], den[1]))}
        if rid in TARGETS:
            entry["target"] = TARGETS[rid]
            entry["meets"] = entry["value"] >= TARGETS[rid]
        out.append(entry)

    for key, row in rows.items():
        if row["workload"] in ("prefill", "decode"):
            for peer in [n for n in names if n != "ours"] + ["roofline"]:
                add(f"{key}/{peer}", (key, "ours"), (key, peer))
    for name in names:
        add(f"cache_speedup/{name}", ("generate_no_cache", name), ("generate_cache", name))
    for peer in [n for n in names if n != "ours"]:
        add(f"continuous/{peer}", ("continuous", "ours"), ("continuous", peer))
    add("continuous/ours_decode_b1", ("continuous", "ours"), ("decode_b1", "ours"))
    return out


def parse_sizes(text: str | None, flag: str) -> tuple[int, ...] | None:
    """"32,128" -> (32, 128); one-line InputError otherwise."""
    if text is None:
        return None
    try:
        sizes = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise InputError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise InputError(f"{flag} values must be >= 1, got {text!r}")
    return sizes


def make_settings(quick: bool, repeats: int, prefill_lengths=None, batches=None) -> Settings:
    s = replace(QUICK if quick else DEFAULT, repeats=repeats)
    if prefill_lengths:
        s = replace(s, prefill_lengths=prefill_lengths)
    if batches:
        s = replace(s, batches=batches)
    return s


def peer_installed(name: str) -> bool:
    """Whether a peer is there to load: an import check, or the cached binary; nothing is loaded or run."""
    import importlib.util

    from .peer_cache import llama_missing

    if name == "llama-batched-bench":
        return llama_missing("llama-batched-bench") is None
    return importlib.util.find_spec({"hf": "transformers", "llama-cpp-python": "llama_cpp"}[name]) is not None


def choose_peers(text: str | None) -> list[str]:
    """--peers: None -> every installed peer, "none" -> [], else the list."""
    from .peers import PEERS

    if text is None:
        return [name for name in PEERS if peer_installed(name)]
    if text.strip() == "none":
        return []
    wanted = [name.strip() for name in text.split(",") if name.strip()]
    if not wanted or any(name not in PEERS for name in wanted):
        raise InputError(f"--peers takes a comma-separated subset of {', '.join(PEERS)}, or none; got {text!r}")
    return wanted


def load_systems(model, wanted: list[str]) -> tuple[list, dict]:
    """[Ours, *peers that loaded] and {peer: {"available", "reason"}} for each wanted peer."""
    from .peers import PEERS

    systems, status = [Ours(model)], {}
    for name in wanted:
        peer = PEERS[name](model.path)
        status[name] = {"available": peer.available(), "reason": peer.reason}
        if peer.available():
            systems.append(peer)
    return systems, status

"""The request-flow diagram, drawn from one real generate() run with the time it spent in each stage (lessons 01, 07).

    request_flow.png    tokenize -> schedule -> prefill (fills the KV cache) -> sample -> [stream + stop checks ->
                        decode step -> sample] ... -> finalize, each box with the function that does it, its file,
                        and this run's measured time; under it the request's timeline from its own metrics

How the stages are timed: StageTimer wraps the functions that implement each stage (prefill.prefill,
decode.decode_step, sampling.sample, ...) with a clock for the length of one generate() call, then puts them back.
The loop in generate.py runs unchanged, so the times are those of the real loop, plus one clock read per call.
On a GPU the clock would time kernel launches, not kernels: `minitransformer figures` draws this on the CPU.
"""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path

from ..core.generate import generate
from ..core.metrics import now
from ..core.request import Result
from ..core.sampling_params import SamplingParams
from .measure import Timing, time_calls
from .viz_concepts import pyplot

# stage -> the functions that do it, as "module of core/:qualified name"; KV cache writes happen inside prefill and
# decode
CORE = "minitransformer.core"
STAGES = {
    "tokenize": ["tokenizer:Tokenizer.encode_chat", "tokenizer:Tokenizer.render_chat", "tokenizer:Tokenizer.encode"],
    "schedule": ["kv_cache:KVCache.__init__"],
    "prefill": ["prefill:prefill"],
    "KV cache": ["kv_storage:KVStorage.put", "kv_storage:KVStorage.get"],
    "sample": ["sampling:sample"],
    "decode": ["decode:decode_step"],
    "stream": ["detokenizer:IncrementalDetokenizer.add_token", "detokenizer:IncrementalDetokenizer.take_delta"],
    "stop checks": ["stopping:check_stop", "stopping:check_abort"],
}
NESTED = ("KV cache",)                   # timed inside another stage: not added again to the total
FLOW_PROMPT = "Explain in two sentences why the sky is blue."
FLOW_PARAMS = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
FLOW_REPEATS = 3                         # timed runs; the fastest is drawn


class StageTimer:
    """Seconds and calls per stage while the `with` block runs. A call made from inside the same stage (encode_chat
    calling encode) is not counted twice: only the outermost one is timed."""

    def __init__(self, stages: dict[str, list[str]] = STAGES):
        self.stages = stages
        self.seconds = {stage: 0.0 for stage in stages}
        self.calls = {stage: 0 for stage in stages}
        self._depth = {stage: 0 for stage in stages}
        self._undo: list[tuple[object, str, object]] = []

    def __enter__(self) -> StageTimer:
        try:
            for stage, targets in self.stages.items():
                for target in targets:
                    owner, name = resolve(target)
                    original = getattr(owner, name)
                    timed = self._timed(stage, original)
                    for namespace in references(owner, name, original):
                        attribute = name if namespace is owner else _alias(namespace, original)
                        assert attribute is not None, "references() lists only the namespaces that hold it"
                        self._undo.append((namespace, attribute, original))
                        setattr(namespace, attribute, timed)
        except Exception:                                # a target that does not resolve: put back what was wrapped
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for namespace, name, original in reversed(self._undo):
            setattr(namespace, name, original)
        self._undo.clear()

    def _timed(self, stage: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self._depth[stage]:                       # already inside this stage: its outer call is timed
                return fn(*args, **kwargs)
            self._depth[stage] += 1
            start = now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[stage] += now() - start
                self.calls[stage] += 1
                self._depth[stage] -= 1
        return timed


def resolve(target: str) -> tuple[object, str]:
    """"kv_storage:KVStorage.put" -> (the KVStorage class, "put"); "prefill:prefill" -> (the module, "prefill")."""
    module, path = target.split(":")
    owner = importlib.import_module(f"{CORE}.{module}")
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def references(owner, name: str, original) -> list:
    """Where a call can find `original`: a method on its class; a function in its module and in every module of the
    package that imported it by name (`from .prefill import prefill` in core/generate.py)."""
    if isinstance(owner, type):
        return [owner]
    root = CORE.split(".")[0]
    package = [m for key, m in list(sys.modules.items()) if key == root or key.startswith(f"{root}.")]
    return [owner] + [m for m in package if m is not owner and _alias(m, original) is not None]


def _alias(module, original) -> str | None:
    return next((key for key, value in vars(module).items() if value is original), None)


def source_file(target: str) -> str:
    """The file a stage function lives in, e.g. "core/prefill.py" (read from the module, not typed by hand)."""
    module = importlib.import_module(f"{CORE}.{target.split(':')[0]}")
    assert module.__file__ is not None, f"{module.__name__} is a module of files"
    return f"core/{Path(module.__file__).name}"


# ---------------------------------------------------------------------------------------------------- the run

def run_request_flow(model, prompt=FLOW_PROMPT, chat: bool = True, repeats: int = FLOW_REPEATS) -> dict:
    """One request through generate() with every stage timed, `repeats` times after a warm-up (measure.time_calls
    makes the calls); returns the stage times and metrics of the fastest run (the others were slowed by whatever
    else the machine was doing, as measure.py's minimum assumes) and the Timing of all of their e2e times."""
    runs = []

    def timed_request():
        with StageTimer() as timer:
            runs.append((generate(model, prompt, FLOW_PARAMS, chat=chat), timer))
    time_calls(timed_request, repeats=repeats, warmup=1)
    runs = runs[1:]                                             # the warm-up's run is not drawn
    result, timer = min(runs, key=lambda run: _e2e_s(run[0]))
    m = result.metrics
    assert m.finished_time is not None, "generate() returns a finished request"
    timeline = {"queue": m.queue_s, "prefill + first sample": m.prefill_s,
                "decode loop": m.token_times[-1] - m.token_times[0], "finalize": m.finished_time - m.token_times[-1]}
    stages = {stage: {"seconds": timer.seconds[stage], "calls": timer.calls[stage],
                      "functions": [t.split(":")[1] for t in targets],
                      "files": sorted({source_file(t) for t in targets})} for stage, targets in STAGES.items()}
    timed = sum(timer.seconds[stage] for stage in STAGES if stage not in NESTED)
    return {"stages": stages, "timeline": timeline, "e2e_s": m.e2e_s, "ttft_s": m.ttft_s,
            "untimed_s": _e2e_s(result) - timed, "metrics": m, "result": result,
            "e2e_of_runs": [_e2e_s(r) for r, _ in runs],
            "e2e": Timing(tuple(_e2e_s(r) for r, _ in runs))}


def _e2e_s(result: Result) -> float:
    """A finished request's end-to-end seconds (generate() returns only finished ones)."""
    e2e_s = result.metrics.e2e_s
    assert e2e_s is not None, "generate() returns a finished request"
    return e2e_s


# ---------------------------------------------------------------------------------------------------- the drawing

# (stage, box centre x, y, what it does); the loop's boxes sit on the lower row
BOXES = [("tokenize", 1.0, 3.0, "chat template, BPE"),
         ("schedule", 3.2, 3.0, "reserve the KV cache\n(prompt + max_tokens)"),
         ("prefill", 5.4, 3.0, "whole prompt, one pass"), ("sample", 7.6, 3.0, "logits -> token"),
         ("stream", 9.8, 3.0, "new text, stop checks"), ("finalize", 12.0, 3.0, "usage, metrics,\nfree the cache"),
         ("decode", 8.7, 0.9, "one token, reads the cache"), ("KV cache", 5.4, 0.9, "K, V of every layer")]
BOX_W, BOX_H = 1.8, 1.5
COLOURS = {"tokenize": "#e8e8f8", "schedule": "#e8e8f8", "prefill": "#cfe3f5", "sample": "#fbe3c8",
           "stream": "#e3f2d9", "finalize": "#e8e8f8", "decode": "#f6d3d3", "KV cache": "#fff3b0"}


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms * 1e3:.0f} us" if ms < 0.1 else f"{ms:.1f} ms" if ms < 100 else f"{ms:,.0f} ms"


def _box_text(stage: str, data: dict) -> str:
    """The box's file, functions and measured time, all read from the run's data."""
    s = data["stages"][stage]
    names = ", ".join(f.split(".")[0] + "()" if f.endswith("__init__") else f.split(".")[-1]
                      for f in s["functions"])                  # KVCache.__init__ reads as KVCache()
    time = f"{s['calls']} call{'s' * (s['calls'] != 1)}: {_ms(s['seconds'])}"
    if s["calls"] > 1:
        time += f"\n({_ms(s['seconds'] / s['calls'])} each)"
    return f"{', '.join(s['files'])}\n{names}\n{time}"


def draw_request_flow(model, path, where: str = "", prompt=FLOW_PROMPT, chat: bool = True,
                      repeats: int = FLOW_REPEATS, data: dict | None = None) -> dict:
    """Run one timed request (or take `data`, run_request_flow's, measured earlier) and draw its stages as boxes and
    arrows with their measured times; return the data."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch
    plt = pyplot()
    data = data or run_request_flow(model, prompt, chat, repeats)
    repeats = len(data["e2e_of_runs"])
    fig, ax = plt.subplots(figsize=(13, 6.6))
    centres = {}
    for stage, x, y, what in BOXES:
        centres[stage] = (x, y)
        ax.add_patch(FancyBboxPatch((x - BOX_W / 2, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0.03",
                                    facecolor=COLOURS[stage], edgecolor="grey"))
        title = "stream + stop checks" if stage == "stream" else stage
        ax.text(x, y + 0.5, title, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x, y + 0.18, what, ha="center", va="center", fontsize=7, style="italic")
        if stage in data["stages"]:
            body = _box_text(stage, data)
        if stage == "stream":                       # two timed stages share this box
            stream, stop = data["stages"]["stream"], data["stages"]["stop checks"]
            body = (f"detokenizer.py: {_ms(stream['seconds'])}\n({stream['calls']} calls)\n"
                    f"stopping.py: {_ms(stop['seconds'])}\n({stop['calls']} calls)")
        elif stage == "finalize":                   # from the metrics: after the last token until done
            body = f"request.py, generate.py\nlast token -> done:\n{_ms(data['timeline']['finalize'])}"
        ax.text(x, y - 0.38, body, ha="center", va="center", fontsize=6.5, family="monospace")

    def arrow(a, b, text="", style="-|>", colour="black"):
        start, end = _edge(centres[a], centres[b]), _edge(centres[b], centres[a])
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=14, lw=1.3, color=colour))
        if text:
            ax.text((start[0] + end[0]) / 2, start[1] + 0.1, text, fontsize=7, ha="center")

    for a, b in (("tokenize", "schedule"), ("schedule", "prefill"), ("prefill", "sample"), ("sample", "stream")):
        arrow(a, b)
    arrow("stream", "finalize", "stop")
    arrow("stream", "decode", colour="tab:red")
    arrow("decode", "sample", colour="tab:red")
    arrow("prefill", "KV cache", colour="darkgoldenrod")
    arrow("decode", "KV cache", style="<|-|>", colour="darkgoldenrod")
    steps = data["stages"]["decode"]["calls"]
    ax.text(9.9, 1.85, f"decode loop: {steps} steps", fontsize=8, color="tab:red", ha="left")
    ax.text(5.5, 2.0, "writes K, V", fontsize=7, color="darkgoldenrod")
    ax.text(7.05, 1.0, "appends K, V,\nreads them all", fontsize=7, color="darkgoldenrod", ha="center")

    _timeline(ax, data)
    result = data["result"]
    runs = f"{repeats} run{'s' * (repeats != 1)}"
    ax.set_title(f"One request through the engine, each stage with the file that does it and its measured time\n"
                 f"generate() on {model.path.stem}: {result.usage.prompt_tokens}-token {'chat ' * chat}prompt, "
                 f"{result.usage.completion_tokens} new tokens (greedy), the fastest of {runs}: e2e "
                 f"{_ms(data['e2e_s'])} (median {_ms(data['e2e'].median)}, slowest {_ms(data['e2e'].max)}), "
                 f"TTFT {_ms(data['ttft_s'])}" + (f"\n{where}" if where else ""), fontsize=10)
    ax.set_xlim(-0.3, 13.3)
    ax.set_ylim(-1.6, 4.0)
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return data


def _edge(centre, towards, pad=0.06) -> tuple[float, float]:
    """Where the line from a box's centre towards another point leaves the box (arrows run edge to edge)."""
    (x, y), (tx, ty) = centre, towards
    dx, dy = tx - x, ty - y
    t = min((BOX_W / 2 + pad) / abs(dx) if dx else float("inf"), (BOX_H / 2 + pad) / abs(dy) if dy else float("inf"))
    return x + t * dx, y + t * dy


def _timeline(ax, data: dict) -> None:
    """The request's life from its own metrics (metrics.py): queue, prefill + first sample, decode loop, finalize."""
    from matplotlib.patches import Rectangle
    x0, width, y = 0.0, 13.0, -1.1
    total = sum(data["timeline"].values())
    colours = ("#e8e8f8", "#cfe3f5", "#f6d3d3", "#d9d9d9")
    for (name, seconds), colour in zip(data["timeline"].items(), colours):
        w = width * seconds / total
        ax.add_patch(Rectangle((x0, y), w, 0.45, facecolor=colour, edgecolor="grey"))
        if w > 1.6:                                   # wide enough to carry its name
            ax.text(x0 + w / 2, y + 0.22, name, fontsize=7, ha="center", va="center")
        x0 += w
    ax.text(0.0, y - 0.12, "   |   ".join(f"{name}: {_ms(s)}" for name, s in data["timeline"].items()),
            fontsize=8, va="top")
    ax.text(0.0, y + 0.6, f"the request's timeline from its metrics (RequestMetrics): e2e {_ms(data['e2e_s'])}; "
            f"time in no timed stage (the loop itself, Delta objects): {_ms(data['untimed_s'])}", fontsize=8)

"""One request on a time axis: where TTFT, ITL, TPOT and E2EL come from, told apart (lessons 07 and 14).

    request_timeline.png   request A decodes on a serving.Engine; after its 8th token request B arrives with a long
                           prompt, and B's prefill runs in the same steps as A's next decode. From A's own
                           RequestMetrics: arrival, scheduled (its queue), first token (TTFT), one tick per later
                           token with the gaps between them (ITL), the end (E2EL); B's life under it; then every
                           ITL of A as a bar, with their mean and TPOT = (E2EL - TTFT) / (tokens - 1)

The point of the picture: one slow step is one tall ITL bar (the ITL p99 sees it), while TPOT spreads it over every
token (it moves the mean by its share). Nothing is drawn that the run did not record: every time is a timestamp of
metrics.RequestMetrics, relative to A's arrival.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.metrics import percentile
from ..core.request import Result
from ..core.sampling_params import SamplingParams
from ..serving import Engine
from .viz_concepts import pyplot

TIMELINE_PROMPT_A = "Write a short poem about the sea."
TIMELINE_PROMPT_B = " ".join(["The history of printing, told in detail:"] + ["presses, paper and ink"] * 90)
A_TOKENS, B_AFTER = 24, 8                       # A's output tokens; B arrives after A's 8th token
TIMELINE_PARAMS_B = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)


def run_request_timeline(model) -> dict:
    """A alone on an Engine; B added after A's B_AFTER-th token; both run to the end -> both RequestMetrics."""
    engine = Engine(model, max_num_seqs=4)
    engine.add_request(TIMELINE_PROMPT_A, SamplingParams(max_tokens=A_TOKENS, temperature=0.0, ignore_eos=True),
                       request_id="A")
    results: dict[str, Result] = {}
    a_tokens, b_added = 0, False
    while engine.has_unfinished_requests():
        for out in engine.step():
            a_tokens += out.request_id == "A" and bool(out.delta.token_ids)
            if out.result is not None:                                   # finished
                results[out.request_id] = out.result
        if a_tokens >= B_AFTER and not b_added:
            engine.add_request(TIMELINE_PROMPT_B, TIMELINE_PARAMS_B, request_id="B")
            b_added = True
    a, b = results["A"].metrics, results["B"].metrics
    assert a.ttft_s is not None and a.e2e_s is not None and a.tpot_s is not None and b.scheduled_time is not None, \
        "both requests ran to the end, A with more than one token"
    t0 = a.arrival_time

    def rel(t):
        return None if t is None else (t - t0) * 1e3                # ms after A arrived
    gaps = np.array(a.itl_s) * 1e3                                   # (A_TOKENS - 1,) ms
    slowest = int(np.argmax(gaps))                                   # the gap between token slowest and slowest + 1
    return {"a": {"arrival": 0.0, "scheduled": rel(a.scheduled_time), "tokens": [rel(t) for t in a.token_times],
                  "finished": rel(a.finished_time), "ttft": a.ttft_s * 1e3, "e2e": a.e2e_s * 1e3,
                  "tpot": a.tpot_s * 1e3, "itl": gaps, "prompt_tokens": len(results["A"].prompt_token_ids)},
            "b": {"arrival": rel(b.arrival_time), "scheduled": rel(b.scheduled_time),
                  "tokens": [rel(t) for t in b.token_times], "finished": rel(b.finished_time),
                  "prompt_tokens": len(results["B"].prompt_token_ids)},
            "slowest_gap": slowest,             # B's prefill ran in the step that ended this gap when B was
            "b_prefill_in_slowest_gap": a.token_times[slowest] < b.scheduled_time < a.token_times[slowest + 1]}
            # scheduled inside it: the step that ends a gap is the one that starts after the token before it


def draw_request_timeline(model, path, where: str = "", data: dict | None = None) -> dict:
    """Draw A's and B's lives on one time axis and A's ITLs as bars, from `data` (run_request_timeline's, which
    `minitransformer figures` times under its Probe) or a run made here; return the drawn data."""
    plt = pyplot()
    data = data if data is not None else run_request_timeline(model)
    a, b = data["a"], data["b"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7.4), gridspec_kw={"height_ratios": (1.1, 1)})
    for row, (name, life, colour) in enumerate((("A", a, "tab:blue"), ("B", b, "tab:purple"))):
        y = 1 - row
        top.barh(y, life["scheduled"] - life["arrival"], left=life["arrival"], height=0.36, color="lightgrey")
        top.barh(y, life["tokens"][0] - life["scheduled"], left=life["scheduled"], height=0.36, color="#f5a623")
        top.barh(y, life["finished"] - life["tokens"][0], left=life["tokens"][0], height=0.36, color=colour,
                 alpha=0.25)
        top.vlines(life["tokens"], y - 0.18, y + 0.18, color=colour, lw=1)
        top.text(life["arrival"], y - 0.34, f"{name} arrives ({life['prompt_tokens']}-token prompt)", fontsize=8,
                 va="top")
    top.annotate("", (a["tokens"][0], 1.42), (0, 1.42), arrowprops=dict(arrowstyle="<->", lw=0.9))
    top.text(a["tokens"][0] / 2, 1.47, f"TTFT {a['ttft']:.0f} ms", ha="center", fontsize=8)
    top.annotate("", (a["finished"], 1.72), (0, 1.72), arrowprops=dict(arrowstyle="<->", lw=0.9))
    top.text(a["finished"] / 2, 1.77, f"E2EL {a['e2e']:.0f} ms ({len(a['tokens'])} tokens)", ha="center",
             fontsize=8)
    top.set_yticks([1, 0], ["request A", "request B"])
    top.set_ylim(-0.75, 2.05)
    top.set_xlabel("ms after A arrived")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c, alpha=al) for c, al in
               (("lightgrey", 1), ("#f5a623", 1), ("tab:blue", 0.25))]
    top.legend(handles, ["queued", "prefill (until the first token)", "decode: a tick per token"], fontsize=8,
               loc="lower right", ncol=3)
    top.set_title("Each request's life from its own timestamps (metrics.RequestMetrics)", fontsize=9.5)

    gaps = a["itl"]
    bars = bottom.bar(range(2, len(gaps) + 2), gaps, color="tab:blue", alpha=0.7)
    bars[data["slowest_gap"]].set_color("tab:red")
    bottom.axhline(float(np.mean(gaps)), color="black", lw=1, ls=":", label=f"mean ITL {np.mean(gaps):.0f} ms")
    bottom.axhline(a["tpot"], color="tab:green", lw=1.2, label=f"TPOT {a['tpot']:.0f} ms = (E2EL - TTFT) / "
                   f"({len(a['tokens'])} - 1)")
    p50 = percentile(gaps, 50) or 0.0
    bottom.axhline(p50, color="grey", lw=1, label=f"ITL p50 {p50:.0f} ms")
    if data["b_prefill_in_slowest_gap"]:
        slow = data["slowest_gap"]
        bottom.annotate(f"B's prefill ({b['prompt_tokens']} tokens) ran in this step: {gaps[slow]:.0f} ms",
                        (slow + 2, gaps[slow]), textcoords="offset points", xytext=(24, -12), fontsize=8,
                        color="tab:red")
    bottom.set_xlabel("A's output token (ITL n = time from token n-1 to token n)")
    bottom.set_ylabel("ITL (ms)")
    bottom.legend(fontsize=8, loc="upper right")
    bottom.set_title("A's inter-token latencies: one slow step is one tall bar; TPOT spreads it over every token",
                     fontsize=9.5)
    fig.suptitle(f"One request on a time axis: TTFT, ITL, TPOT and E2EL, on a serving.Engine running "
                 f"{model.path.stem}" + (f"\n{where}" if where else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(Path(path), dpi=100)
    plt.close(fig)
    return data

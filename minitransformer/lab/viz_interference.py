"""The chats' gaps between tokens over one round, per server: where a long prompt's prefill lands (lesson 16).

    disaggregated_itl.png   one panel per configuration (no chunking, chunked, disaggregated): every chat token's
                            gap since the chat's previous token, drawn at the moment it arrived at the client, on a
                            log scale; a vertical line where each long prompt was sent; the dashed line is the
                            round's ITL p99

Nothing is drawn that the run did not record: the times are the client's (bench/serve.py's RequestRecord: when a
request was sent, its TTFT, each ITL gap), from the last round the lesson ran against each server.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.metrics import percentile
from .viz_concepts import pyplot

CHAT, LONG = "chat", "long"        # the two kinds of request of lesson 16's workload (bench/interference.py)


def chat_gaps(done) -> tuple[list[float], list[float]]:
    """One round's (Arrival, RequestRecord) pairs -> (when each chat token after the first arrived, its gap), in s."""
    times, gaps = [], []
    for arrival, record in done:
        if arrival.kind != CHAT or not record.ok or record.ttft_s is None:
            continue
        at = record.sent_s + record.ttft_s
        for gap in record.itl_s:
            at += gap
            times.append(at)
            gaps.append(gap)
    return times, gaps


def draw_interference(rounds: dict, path) -> None:
    """rounds: {configuration: one round's [(Arrival, RequestRecord)]}, in the order the panels are drawn."""
    plt = pyplot()
    fig, axes = plt.subplots(len(rounds), 1, figsize=(9, 2.4 * len(rounds)), sharex=True, sharey=True)
    axes = np.atleast_1d(axes)
    for ax, (config, done) in zip(axes, rounds.items()):
        times, gaps = chat_gaps(done)
        ax.scatter(times, np.asarray(gaps) * 1e3, s=6, color="tab:blue", label="a chat token's gap")
        for i, record in enumerate(r for a, r in done if a.kind == LONG):
            ax.axvline(record.sent_s, color="tab:red", lw=1, alpha=0.7, label="a long prompt sent" if i == 0 else None)
        if gaps:
            p99 = (percentile(gaps, 99) or 0.0) * 1e3
            ax.axhline(p99, color="0.3", ls="--", lw=1, label=f"ITL p99 {p99:,.0f} ms")
        ax.set_yscale("log")
        ax.set_title(config, loc="left", fontsize=10)
        ax.set_ylabel("gap, ms")
        ax.legend(loc="upper right", fontsize=7)
    axes[-1].set_xlabel("seconds since the round began (the client's clock)")
    fig.suptitle("Short chats' inter-token gaps while long prompts arrive", fontsize=11)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)

"""Prefill/decode interference, measured over HTTP: steady short chats, and now and then a long prompt (lesson 16).

    Traffic          what is sent: short chats at Poisson times, long prompts spread evenly over the same span
    arrivals         one round of it: (time, kind, prompt, max_tokens) in sending order, text no other round uses
    run_round        every arrival at its time through the streaming API (bench/serve.py's client) -> RequestRecords
    warm_up_plan     what to send each server once before the measured rounds
    summarize        one round -> the chats' TTFT and ITL percentiles, the long prompts' TTFT
    transfer_totals  a disaggregated server's /metrics: KV transfers, bytes and seconds, prefill time so far

A decode step that carries a long prompt's prefill takes as long as that prefill: every chat that is decoding
meanwhile waits that long for its next token, which is what the chats' ITL p99 shows. Chunked prefill bounds how
much prefill one step carries; disaggregation moves the prefill out of the decode process altogether. The chats are
the victims, so their numbers are the ones that matter; the long prompts' TTFT is what each fix costs them.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from ..core.metrics import now, percentile
from ..lab.viz_interference import CHAT, LONG
from ..server.prometheus import PREFILL_TIME, TRANSFER_BYTES, TRANSFER_TIME
from .serve import RequestRecord, ServeSettings, api_base, build_payload, first_model, http_client, send_request
from .serve_workload import arrival_times, make_prompts


@dataclass(frozen=True)
class Traffic:
    """One round's requests. The chats ask for chat_tokens each, EOS ignored, so every run decodes the same tokens."""
    chats: int = 20
    chat_rate: float = 2.0           # chats per second, Poisson
    chat_words: int = 24
    chat_tokens: int = 24
    long_prompts: int = 4
    long_words: int = 900            # ~1,200 tokens of SmolLM2's tokenizer
    long_tokens: int = 4
    seed: int = 0


@dataclass(frozen=True)
class Arrival:
    at_s: float
    kind: str                        # CHAT or LONG
    prompt: str
    max_tokens: int


def arrivals(t: Traffic, round: int) -> list[Arrival]:
    """The chats at Poisson times; the long prompts at evenly spaced points of the chats' span (never the first
    instant, so some chats are decoding when each arrives). Each round's text starts where no other round's does,
    so no round finds another's prompts in a prefix cache (serve_workload.make_prompts)."""
    chat_times = arrival_times(t.chat_rate, t.chats, t.seed + round)
    span = float(chat_times[-1]) if t.chats else 0.0
    out = [Arrival(float(at), CHAT, prompt, t.chat_tokens)
           for at, prompt in zip(chat_times, make_prompts(t.chats, t.seed, (t.chat_words,), round=2 * round))]
    long_times = [span * (k + 1) / (t.long_prompts + 1) for k in range(t.long_prompts)]
    out += [Arrival(at, LONG, prompt, t.long_tokens)
            for at, prompt in zip(long_times, make_prompts(t.long_prompts, t.seed + 1, (t.long_words,),
                                                            round=2 * round + 1))]
    return sorted(out, key=lambda a: a.at_s)


async def run_round(url: str, plan: list[Arrival], timeout_s: float = 300.0) -> list[tuple[Arrival, RequestRecord]]:
    """Send each arrival at its time (completions, streamed, EOS ignored, greedy) and record what the client saw."""
    s = ServeSettings(ignore_eos=True, temperature=0.0, timeout_s=timeout_s)
    base = api_base(url)
    async with http_client(base, s) as client:
        model = await first_model(client, base)
        start = now()

        async def one(arrival: Arrival) -> tuple[Arrival, RequestRecord]:
            await asyncio.sleep(max(0.0, start + arrival.at_s - now()))
            record = RequestRecord(prompt_words=len(arrival.prompt.split()), sent_s=now() - start)
            payload = {**build_payload(arrival.prompt, model, s), "max_tokens": arrival.max_tokens}
            return arrival, await send_request(client, f"{base}/v1/completions", payload, "completions", record)

        return list(await asyncio.gather(*(one(a) for a in plan)))


def warm_up_plan(t: Traffic, rounds: int) -> list[Arrival]:
    """One chat and one long prompt at once, with text of a round the measured ones do not use (their round
    numbers run from 0 to rounds - 1): a server's first request of each size, and the rest of its start (the second
    rank of a disaggregated server loading its model), happen here and not in the first round."""
    plan = arrivals(Traffic(chats=1, chat_rate=t.chat_rate, chat_words=t.chat_words, chat_tokens=4, long_prompts=1,
                            long_words=t.long_words, long_tokens=t.long_tokens, seed=t.seed), rounds)
    return [Arrival(0.0, a.kind, a.prompt, a.max_tokens) for a in plan]


@dataclass(frozen=True)
class RoundSummary:
    """One round of one configuration, in seconds (percentiles over the round's requests; ITL over every gap)."""
    chat_ttft_p50: float
    chat_ttft_p99: float
    chat_itl_p50: float
    chat_itl_p99: float
    long_ttft_p50: float
    prompt_tokens: int               # of every request of the round (usage), for bytes per prompt token
    failed: int


def summarize(done: list[tuple[Arrival, RequestRecord]]) -> RoundSummary:
    chats = [r for a, r in done if a.kind == CHAT and r.ok]
    longs = [r for a, r in done if a.kind == LONG and r.ok]
    gaps = [g for r in chats for g in r.itl_s]

    def pct(values, q: float) -> float:
        found = percentile(values, q)
        return float("nan") if found is None else found
    return RoundSummary(pct([r.ttft_s for r in chats], 50), pct([r.ttft_s for r in chats], 99), pct(gaps, 50),
                        pct(gaps, 99), pct([r.ttft_s for r in longs], 50),
                        sum(r.prompt_tokens or 0 for _, r in done), sum(1 for _, r in done if not r.ok))


TRANSFER_METRICS = {"count": f"{TRANSFER_BYTES}_count", "bytes": f"{TRANSFER_BYTES}_sum",
                    "seconds": f"{TRANSFER_TIME}_sum", "prefill_s": f"{PREFILL_TIME}_sum"}


def transfer_totals(url: str) -> dict[str, float]:
    """A disaggregated server's KV transfers so far, off its /metrics: {"count", "bytes", "seconds"}, and its
    requests' summed prefill time, first schedule to first token ("prefill_s"; the transfer is part of it)."""
    import httpx

    text = httpx.get(f"{api_base(url)}/metrics", timeout=10, trust_env=False).text
    totals = {}
    for key, name in TRANSFER_METRICS.items():
        found = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
        if found is None:
            raise ValueError(f"{url}/metrics has no {name}: is it `serve --disaggregated`?")
        totals[key] = float(found.group(1))
    return totals

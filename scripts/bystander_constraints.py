"""What hostile constraints cost a bystander: one client streams a long greedy completion from a real
`minitransformer serve` while three neighbours loop requests, either plain completions or hostile structured-output
constraints (ones the limits refuse at compile time, big ones within the limits that run, one that fails
mid-request). Prints the bystander's gaps between chunks (as the client sees them) for each kind of neighbour, the
kinds taken in turns, and their ratio; the server's /health after. Run it on a quiet machine (nothing else running):

    python scripts/bystander_constraints.py [--rounds 2] [--tokens 120]

The README's hardening section quotes it: a bystander beside three hostile neighbours within 1.5x of three plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from minitransformer.core.metrics import now
from test_structured_limits import NESTED, lark_alternatives, optional_properties

HOSTILE = [
    {"prompt": "x", "max_tokens": 32, "structured_outputs": {"regex": NESTED}},
    {"prompt": "x", "max_tokens": 32, "structured_outputs": {"regex": "((a{50}){50}){50}"}},
    {"prompt": "x", "max_tokens": 32, "structured_outputs": {"regex": "a{65536}"}},
    {"prompt": "Fill in the form:", "max_tokens": 32, "structured_outputs": {"json": optional_properties(500)}},
    {"prompt": "Pick one:", "max_tokens": 32, "structured_outputs": {"grammar": lark_alternatives(3000)}},
    {"prompt": "Write letters:", "max_tokens": 32, "structured_outputs": {"regex": "[a-z ]{0,4000}"}},
    {"prompt": "x", "max_tokens": 32, "structured_outputs": {"regex": "((x{1,30}){1,30}){1,30}"}},
]
PLAIN = [{"prompt": "Tell me about the sea.", "max_tokens": 32, "temperature": 0, "ignore_eos": True}]


def neighbour(url: str, bodies: list[dict], stop: threading.Event, counts: dict) -> None:
    i = 0
    with httpx.Client(timeout=300) as http:
        while not stop.is_set():
            r = http.post(url + "/v1/completions", json=bodies[i % len(bodies)])
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            i += 1


def bystander(url: str, tokens: int) -> list[float]:
    body = {"prompt": "Write a long story about a lighthouse.", "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    times = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    times.append(now())
    return [b - a for a, b in zip(times, times[1:])][5:]          # past the neighbours' start-up


def run(url: str, bodies: list[dict], tokens: int) -> tuple[list[float], dict]:
    stop, counts = threading.Event(), {}
    threads = [threading.Thread(target=neighbour, args=(url, bodies, stop, counts), daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(3)
    gaps = bystander(url, tokens)
    stop.set()
    for t in threads:
        t.join(300)
    return gaps, counts


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=120)
    args = p.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "minitransformer", "serve", "--port", "0", "--max-num-seqs", "8",
                               "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=ROOT)
    url = None
    for line in server.stdout:
        if "http://127.0.0.1:" in line:
            url = "http://" + line.split("http://")[1].split()[0]
            break
    threading.Thread(target=lambda: [None for _ in server.stdout], daemon=True).start()
    results: dict[str, list[float]] = {"plain": [], "hostile": []}
    try:
        for r in range(args.rounds):
            for name, bodies in (("plain", PLAIN), ("hostile", HOSTILE)):
                gaps, counts = run(url, bodies, args.tokens)
                results[name] += gaps
                print(f"round {r + 1} {name:8s} bystander gap mean {statistics.mean(gaps) * 1e3:7.1f} ms  "
                      f"p90 {sorted(gaps)[int(0.9 * len(gaps))] * 1e3:7.1f} ms  neighbour answers {counts}",
                      flush=True)
        plain, hostile = results["plain"], results["hostile"]
        mean_ratio = statistics.mean(hostile) / statistics.mean(plain)
        p90_ratio = sorted(hostile)[int(0.9 * len(hostile))] / sorted(plain)[int(0.9 * len(plain))]
        print(f"all rounds: plain mean {statistics.mean(plain) * 1e3:.1f} ms, hostile mean "
              f"{statistics.mean(hostile) * 1e3:.1f} ms, ratio {mean_ratio:.2f}x; p90 ratio {p90_ratio:.2f}x")
        health = httpx.get(url + "/health").json()
        print("health after:", health)
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()

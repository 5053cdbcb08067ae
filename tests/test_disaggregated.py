"""Disaggregated prefill/decode (serving/kv_transfer.py, the engine's kv_connector, parallel/kv_connector.py).

What is checked: a prefill engine and a decode engine joined by the in-process LocalConnector give the tokens of
one colocated engine for 8 concurrent requests (greedy and seeded, with logprobs, a pool small enough to preempt on
the decode side, prefix-cache hits on the prefill side), and every block of both pools is free at the end, also when
a request is aborted at each point of its way: waiting at the prefill engine, its KV on the way back, back but not
yet adopted, and decoding. Then `serve --disaggregated` (two MPI ranks, the real model): 8 concurrent greedy
requests through the official `openai` client get the colocated engine's text; clients that disconnect during the
prefill or the decode leave both pools free (read off /metrics); SIGTERM stops both ranks with exit 0; options that
cannot run are refused with exit 2. No process outlives a test.
"""

from __future__ import annotations

import os
import re
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest

from minitransformer.core.errors import InputError
from minitransformer.core.sampling_params import SamplingParams
from minitransformer.serving import Engine
from minitransformer.serving.kv_transfer import LocalConnector
from server_process import ServerProcess, running_server, wait_for
from test_tensor_parallel import cli, needs_mpi, process_tag

__all__ = ["process_tag"]                       # a fixture shared with test_tensor_parallel.py

PROMPTS = [f"The number {i} is " * (1 + i % 4) for i in range(8)]


def request_params(i: int, max_tokens: int = 10) -> SamplingParams:
    """Even requests greedy, odd ones seeded sampling with logprobs (the generator's state must travel too)."""
    if i % 2 == 0:
        return SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return SamplingParams(max_tokens=max_tokens, temperature=0.9, seed=i, logprobs=2)


def colocated(model, prompts, params, **engine):
    ref = Engine(model, **engine)
    ids = [ref.add_request(p, sp) for p, sp in zip(prompts, params)]
    results = ref.run()
    return [results[i] for i in ids]


class Pair:
    """A prefill engine and a decode engine in one process, stepped in turns as two processes would run."""

    def __init__(self, model, producer_seqs: int | None = None, **engine):
        self.link = LocalConnector()
        self.producer = Engine(model, kv_connector=self.link.producer,
                               **{**engine, "max_num_seqs": producer_seqs or engine.get("max_num_seqs", 16)})
        self.consumer = Engine(model, kv_connector=self.link.consumer, **engine)
        self.results: dict = {}

    def step(self, producer: bool = True, consumer: bool = True) -> None:
        if producer:
            self.link.serve_producer(self.producer)
            if self.producer.has_unfinished_requests():
                self.producer.step()
        if consumer:
            for out in self.consumer.step():
                if out.result is not None:
                    self.results[out.request_id] = out.result
        self.producer.block_manager.check()
        self.consumer.block_manager.check()

    def run(self) -> dict:
        while self.consumer.has_unfinished_requests():
            self.step()
        self.step()                                           # the producer takes in the last aborts
        return self.results

    def assert_all_free(self) -> None:
        for engine in (self.producer, self.consumer):
            assert engine.stats.num_free_blocks == engine.stats.num_blocks
            assert not engine.has_unfinished_requests()


@pytest.mark.parametrize("model_name", ["tiny_model", "real_model"])
def test_the_pair_gives_the_colocated_tokens(model_name, request):
    model = request.getfixturevalue(model_name)
    params = [request_params(i) for i in range(8)]
    prompts = PROMPTS + PROMPTS[:2]                          # two repeats: prefix-cache hits at the producer
    params += [request_params(0), request_params(1)]
    engine = dict(max_num_seqs=8, num_blocks=40, block_size=4, max_num_batched_tokens=64)   # tight: preemptions
    expected = colocated(model, prompts, params, **engine)
    pair = Pair(model, **engine)
    ids = [pair.consumer.add_request(p, sp) for p, sp in zip(prompts, params)]
    results = pair.run()
    for rid, want in zip(ids, expected):
        got = results[rid]
        assert got.token_ids == want.token_ids, (rid, got.text, want.text)
        assert got.text == want.text and got.finish_reason == want.finish_reason
        if want.logprobs is not None:
            assert [e["token_id"] for e in got.logprobs] == [e["token_id"] for e in want.logprobs]
    assert pair.producer.stats.prefix_cache_hits > 0
    stats = pair.consumer.take_kv_transfer_stats()
    assert stats.transfers == len(prompts) and stats.discarded == 0 and stats.in_flight == 0
    per_token = model.config.n_layers * 2 * model.config.n_kv_heads * model.config.head_dim * 4
    assert stats.bytes == per_token * sum(r.usage.prompt_tokens for r in results.values())
    assert [r.metrics.ttft_s > 0 for r in results.values()] == [True] * len(prompts)
    pair.assert_all_free()


def test_aborts_at_every_point_free_both_pools(tiny_model):
    pair = Pair(tiny_model, producer_seqs=8, max_num_seqs=1, num_blocks=64, block_size=4)   # one decode seat
    params = SamplingParams(max_tokens=8, temperature=0.0)
    ids = [pair.consumer.add_request(PROMPTS[i], params) for i in range(5)]
    consumer = pair.consumer
    consumer.abort(ids[0])                                   # 0: before the producer has even seen it
    pair.step(consumer=False)                                # the producer prefills 1..4 and sends them back
    pair.step(consumer=False)
    assert len(pair.link.transfers) == 4
    consumer.abort(ids[1])                                   # 1: its KV on the way back
    pair.step(producer=False)                                # 1 dropped; 2 adopted (the seat); 3, 4 wait
    consumer.abort(ids[3])                                   # 3: back, not adopted yet
    pair.step(producer=False)
    consumer.abort(ids[2])                                   # 2: decoding
    results = pair.run()
    assert [results[i].finish_reason for i in ids] == ["abort", "abort", "abort", "abort", "length"]
    assert results[ids[2]].token_ids and results[ids[4]].token_ids
    stats = consumer.take_kv_transfer_stats()
    assert (stats.transfers, stats.discarded, stats.in_flight) == (3, 1, 0)
    pair.assert_all_free()


def test_the_decode_side_refuses_the_static_policy(tiny_model):
    with pytest.raises(InputError, match="static"):
        Engine(tiny_model, policy="static", kv_connector=LocalConnector().consumer)


# ------------------------------------------------------------------------------- serve --disaggregated (MPI)

def metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return float(re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M).group(1))


def both_pools_free(url: str) -> bool:
    return (metric(url, "vllm:kv_cache_usage_perc") == 0.0
            and metric(url, "minitransformer:prefill_kv_cache_usage_perc") == 0.0
            and metric(url, "minitransformer:kv_transfers_in_flight") == 0)


@needs_mpi
def test_serve_disaggregated(real_model, real_model_path, process_tag):
    params = [SamplingParams(max_tokens=16, temperature=0.0) for _ in PROMPTS]
    expected = colocated(real_model, PROMPTS, params)
    with running_server("--disaggregated", "--model", str(real_model_path), "--max-num-seqs", "8",
                        "--max-num-batched-tokens", "256") as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        name = client.models.list().data[0].id

        def complete(prompt: str):
            return client.completions.create(model=name, prompt=prompt, max_tokens=16, temperature=0.0)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(complete, PROMPTS))
        assert [a.choices[0].text for a in answers] == [r.text for r in expected]
        assert [a.usage.completion_tokens for a in answers] == [len(r.token_ids) for r in expected]
        assert metric(server.url, "minitransformer:mpi_bytes_transferred_count") == len(PROMPTS)

        # clients that leave: one during its long prompt's prefill (at the prefill rank), one while decoding
        long_prompt = "The lighthouse keeper wrote about the sea. " * 150               # ~1,350 tokens
        for prompt, after_chunks in ((long_prompt, 0), (PROMPTS[0], 3)):
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=60,
                              json={"model": name, "prompt": prompt, "max_tokens": 200, "stream": True,
                                    "ignore_eos": True}) as response:
                for i, _ in enumerate(response.iter_lines()):
                    if i >= after_chunks:
                        break
            assert wait_for(lambda: both_pools_free(server.url), 30), httpx.get(f"{server.url}/metrics").text
        aborted = re.search(r'^vllm:request_success_total\{[^}]*finished_reason="abort"\} (\d+)$',
                            httpx.get(f"{server.url}/metrics").text, re.M)
        assert aborted is not None and int(aborted.group(1)) == 2
        assert complete(PROMPTS[1]).choices[0].text == expected[1].text          # still serving after both
    assert server.process.returncode == 0


@needs_mpi
@pytest.mark.parametrize("options, message", [
    (["--tensor-parallel-size", "3"], "--tensor-parallel-size"),
    (["--policy", "static"], "static"),
])
def test_serve_disaggregated_refuses(tiny_model_path, options, message):
    done = cli("serve", "--disaggregated", "--port", "0", "--model", str(tiny_model_path), *options, timeout=60)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1


@needs_mpi
def test_a_dead_prefill_process_is_named_in_one_line_without_mpiexecs_banner(tiny_model_path, process_tag):
    """The death line names the process that died (the prefill process, rank 1), not "a tensor-parallel rank", and
    none of mpiexec's 80-column banner of '=' reaches the terminal."""
    server = ServerProcess(["--disaggregated", "--model", str(tiny_model_path), "--log-level", "warning"])
    try:
        prefill = wait_for(lambda: rank_pids(server.process.pid).get(1), 60)
        assert prefill, server.log
        os.kill(prefill, signal.SIGKILL)
        assert server.process.wait(60) == 1
        server.reader.join(10)
    finally:
        server.stop()
    lines = server.log.strip().splitlines()
    errors = [line for line in lines if line.startswith("minitransformer: error:")]
    assert len(errors) == 1 and errors[0].startswith("minitransformer: error: the prefill process (rank 1) died"), \
        server.log
    assert not any(line and set(line) == {"="} for line in lines) and "BAD TERMINATION" not in server.log
    assert "Traceback" not in server.log, server.log


def rank_pids(supervisor: int) -> dict[int, int]:
    """The ranks `supervisor` started, by rank number (PMI_RANK is Hydra's name for it)."""
    ranks = {}
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if f"MINITRANSFORMER_TP_SUPERVISOR={supervisor}".encode() in environ:
            rank = next((v for v in environ if v.startswith(b"PMI_RANK=")), None)
            if rank is not None:
                ranks[int(rank.split(b"=")[1])] = int(entry.name)
    return ranks

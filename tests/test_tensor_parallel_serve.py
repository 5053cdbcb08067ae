"""The serving engine and `serve` under tensor parallelism (parallel/driver.py's paged step; cli/serve.py).

What is checked: a worker rebuilds every engine step from the step messages alone (its pool ends equal to the
driver's, no MPI needed); the Engine at size 3 gives the greedy tokens of size 1 for 8 concurrent requests through a
pool small enough to preempt, with prefix-cache hits and an abort (tiny model and SmolLM2); `serve
--tensor-parallel-size 3` answers 8 concurrent requests through the official `openai` client with the text of size
1, drains on SIGTERM or Ctrl-C and exits 0; a killed worker ends the running request with an error within seconds
and the server with it (every rank stopped, the supervisor's one line, exit 1). No process outlives a test.
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import httpx
import numpy as np
import openai
import pytest

from minitransformer import load_model
from minitransformer.core.errors import InputError
from minitransformer.core.sampling_params import SamplingParams
from minitransformer.parallel import driver as driver_module
from minitransformer.parallel.communicator import CollectiveStats
from minitransformer.parallel.driver import DriverTransformer, StepMessage, serve_worker
from minitransformer.serving import Engine
from minitransformer.serving.paged_cache import PagedKVCache
from server_process import ServerProcess
from test_tensor_parallel import cli, mpiexec, needs_mpi, process_tag, six_head_path, worker_pids

__all__ = ["process_tag", "six_head_path"]      # fixtures shared with test_tensor_parallel.py

PROMPTS = [f"Write one sentence about the number {i}." for i in range(8)]


# ------------------------------------------------------------------------------------------- one process, no MPI

class RecordingGroup:
    """A driver's group that only records what it would broadcast (a world of one: the driver runs alone)."""
    rank, world_size = 0, 1

    def __init__(self):
        self.stats, self.sent = CollectiveStats(), []

    def broadcast(self, obj=None):
        self.sent.append(obj)
        return obj


class ReplayingGroup:
    """A worker's group that receives the recorded messages in order."""
    rank, world_size = 1, 2

    def __init__(self, messages):
        self.stats, self.messages = CollectiveStats(), list(messages)

    def broadcast(self, obj=None):
        return self.messages.pop(0)


def test_a_worker_rebuilds_every_engine_step_from_the_messages_alone(six_head_path):
    """A worker sees only StepMessages: replayed into serve_worker on a second copy of the model, they leave its
    own pool equal to the engine's, block for block (preemption, prefix hits and an abort included), and a pool the
    driver dropped is named in the next message."""
    group = RecordingGroup()
    driver = DriverTransformer(load_model(six_head_path), group)
    engine = Engine(driver, max_num_seqs=8, num_blocks=40, block_size=4, max_num_batched_tokens=48)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    for i in range(8):
        engine.add_request(f"Once upon a time there was a little robot who lived in a quiet town. Story {i}:",
                           params, request_id=f"r{i}")
    while engine.has_unfinished_requests():
        if engine.num_steps == 6:
            engine.abort("r7")
        engine.step()
    assert engine.stats.num_preemptions > 0 and engine.stats.prefix_cache_hits > 0
    pools: list[PagedKVCache] = []

    def keep(*args, **kwargs):
        pools.append(PagedKVCache(*args, **kwargs))
        return pools[-1]

    with mock.patch.object(driver_module, "PagedKVCache", side_effect=keep):
        steps = serve_worker(load_model(six_head_path), ReplayingGroup(group.sent + [StepMessage("stop")]))
    assert steps == len(group.sent) > engine.num_steps // 2            # one message per forward
    assert len(pools) == 1 and pools[0].num_blocks == 40 and pools[0].block_size == 4
    np.testing.assert_array_equal(pools[0].k, engine.cache.k)
    np.testing.assert_array_equal(pools[0].v, engine.cache.v)
    del engine
    gc.collect()
    driver.forward([[1, 2]], [[0, 1]])
    assert group.sent[-1].released_pools == [0] and group.sent[-1].cache is None


def test_cuda_graphs_are_refused_under_tensor_parallelism(six_head_path):
    model = load_model(six_head_path)
    model.comm = RecordingGroup()           # what a rank's model carries (parallel/driver.py)
    with pytest.raises(InputError, match="cuda_graphs cannot run under tensor parallelism"):
        Engine(model, num_blocks=8, cuda_graphs=True)
    assert Engine(model, num_blocks=8).cuda_graphs is False


# ------------------------------------------------------------------------------------------- the engine under mpiexec

def check_engine_run(out: dict) -> None:
    tp, one = out["tp"], out["one"]
    assert tp["tokens"] == one["tokens"] and tp["finish"] == one["finish"]
    assert sorted(tp["finish"].values()) == ["abort"] + ["length"] * 7
    assert tp["preemptions"] > 0 and tp["prefix_hits"] > 0              # the paths under test did run
    assert tp["free_blocks"] == tp["num_blocks"]                         # every block came back
    assert out["broadcasts"] > 0


@needs_mpi
def test_the_engine_at_size_3_gives_the_tokens_of_size_1_on_the_tiny_model(six_head_path, process_tag):
    check_engine_run(mpiexec(3, "engine", str(six_head_path), "16", "40"))


@needs_mpi
def test_the_engine_at_size_3_gives_the_tokens_of_size_1_on_smollm2(real_model_path, process_tag):
    check_engine_run(mpiexec(3, "engine", str(real_model_path), "12", "24", timeout=600))


# ------------------------------------------------------------------------------------------- the server

def test_serve_refuses_a_size_that_cannot_split_the_heads_before_any_rank_starts(six_head_path, process_tag):
    run = cli("serve", "--model", str(six_head_path), "--port", "0", "--tensor-parallel-size", "2")
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "6 query heads, 3 KV heads and FFN 192" in lines[0]


def test_serve_refuses_a_port_in_use_before_any_rank_starts(six_head_path, process_tag):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        run = cli("serve", "--model", str(six_head_path), "--port", port, "--tensor-parallel-size", "3")
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"minitransformer: error: cannot listen on 127.0.0.1:{port}: "
                                               "Address already in use"]


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def greedy_texts(server: ServerProcess) -> list[str]:
    """8 concurrent greedy completions through the official client."""
    api = client(server)

    def complete(prompt: str) -> str:
        out = api.completions.create(model="smol", prompt=prompt, max_tokens=12, temperature=0.0,
                                     extra_body={"ignore_eos": True})
        assert out.usage is not None and out.usage.completion_tokens == 12
        return out.choices[0].text

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(complete, PROMPTS))


SERVE = ("--served-model-name", "smol", "--num-blocks", "128", "--max-num-seqs", "8")


@needs_mpi
def test_serve_at_size_3_answers_8_concurrent_requests_with_the_text_of_size_1_and_drains_on_sigterm(
        real_model_path, process_tag):
    one = ServerProcess(["--model", str(real_model_path), *SERVE])
    try:
        expected = greedy_texts(one)
    finally:
        one.stop()
    three = ServerProcess(["--model", str(real_model_path), *SERVE, "--tensor-parallel-size", "3"])
    try:
        assert "tensor parallel over 3 ranks" in three.log
        assert three.wait_for_log("Application startup complete")
        assert greedy_texts(three) == expected and all(expected)
        assert len(worker_pids(three.process.pid)) == 2
        stream = client(three).completions.create(model="smol", prompt="Once upon a time", max_tokens=400,
                                                  temperature=0.0, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)                                     # the request is running on every rank
        three.process.send_signal(signal.SIGTERM)        # what a service manager sends: rank 0 drains, then all end
        finishes = [chunk.choices[0].finish_reason for chunk in chunks]
        assert finishes[-1] == "abort"                   # ended by the drain, with its partial text
        assert three.process.wait(30) == 0
    finally:
        three.stop()
    assert "Traceback" not in three.log, three.log
    assert "the engine stopped; 128 of 128 KV blocks free" in three.log


@needs_mpi
def test_ctrl_c_on_serve_at_size_3_drains_rank_0_and_every_rank_exits_0(six_head_path, process_tag):
    server = ServerProcess(["--model", str(six_head_path), "--tensor-parallel-size", "3"])
    try:
        assert server.wait_for_log("Application startup complete")     # uvicorn's signal handlers are set
        server.process.send_signal(signal.SIGINT)       # the supervisor passes it to rank 0 as SIGTERM
        assert server.process.wait(30) == 0, server.log
    finally:
        server.stop()
    assert "the engine stopped; 128 of 128 KV blocks free" in server.log and "Traceback" not in server.log


@needs_mpi
def test_a_killed_worker_ends_the_running_request_with_an_error_within_seconds(real_model_path, process_tag):
    """A rank that dies takes its shard of every layer with it: no request can go on, so the job ends at once
    (Hydra stops the other ranks), the running stream breaks off without [DONE], the server is gone, and the
    command exits 1 with one line saying a rank died (vLLM's engine, too, shuts its server down when a worker
    dies)."""
    server = ServerProcess(["--model", str(real_model_path), *SERVE, "--tensor-parallel-size", "3"])
    try:
        stream = client(server).completions.create(model="smol", prompt="Once upon a time", max_tokens=400,
                                                   temperature=0.0, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        next(chunks)
        workers = worker_pids(server.process.pid)
        assert len(workers) == 2
        environ = Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0")
        rank = next(v for v in environ if v.startswith(b"PMI_RANK=")).split(b"=")[1].decode()
        os.kill(workers[0], signal.SIGKILL)
        killed_at = time.monotonic()
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            for _ in chunks:
                pass
        assert time.monotonic() - killed_at < 15
        assert server.process.wait(30) == 1
        with pytest.raises(openai.APIConnectionError):
            client(server).models.list()
    finally:
        server.stop()
    assert f"minitransformer: error: tensor-parallel rank {rank} died" in server.log      # the rank that was killed
    assert "BAD TERMINATION" not in server.log and "=====" not in server.log

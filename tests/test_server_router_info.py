"""What a router reads from a replica (server/router_info.py): /v1/loads follows the engine's queues and KV pool
while requests run and wait, /server_info names the served model and the engine's sizes, /version is open to all;
the operator's pages need the metrics key as /metrics does."""

from __future__ import annotations

import threading

import httpx
import pytest

import minitransformer
from server_process import running_server, wait_for

KEY = {"Authorization": "Bearer operator-key"}
NUM_BLOCKS, BLOCK_SIZE = 64, 16


@pytest.fixture(scope="module")
def server(real_model_path):
    # one running slot: a second request has to wait, so the queue depth is there to see
    with running_server("--model", str(real_model_path), "--max-num-seqs", "1", "--num-blocks", str(NUM_BLOCKS),
                        "--metrics-key", "operator-key", "--log-level", "warning") as server:
        yield server


def loads(server) -> dict:
    response = httpx.get(server.url + "/v1/loads?include=core,disagg,queues,memory", headers=KEY)
    assert response.status_code == 200, response.text
    return response.json()


def test_version_is_open_and_server_info_names_the_model_and_the_engines_sizes(server):
    assert httpx.get(server.url + "/version").json() == {"version": minitransformer.__version__}
    assert httpx.get(server.url + "/server_info").status_code == 401          # the operator's page
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    info = httpx.get(server.url + "/server_info", headers=KEY).json()
    assert info == httpx.get(server.url + "/get_server_info", headers=KEY).json()
    assert info["served_model_name"] == info["model_path"] == card["id"]
    assert info["context_length"] == card["max_model_len"]
    assert (info["max_running_requests"], info["max_total_tokens"], info["page_size"], info["dp_size"]) == \
        (1, NUM_BLOCKS * BLOCK_SIZE, BLOCK_SIZE, 1)


def test_loads_follow_a_running_and_a_waiting_request(server):
    idle = loads(server)
    assert idle["dp_rank_count"] == 1 and len(idle["loads"]) == 1
    load = idle["loads"][0]
    assert (load["num_running_reqs"], load["num_waiting_reqs"], load["num_used_tokens"], load["token_usage"]) == \
        (0, 0, 0, 0.0)
    assert (load["max_total_num_tokens"], load["max_running_requests"]) == (NUM_BLOCKS * BLOCK_SIZE, 1)

    long = {"prompt": "Write a long story about a dragon.", "max_tokens": 300, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=long, timeout=120) as response:
        lines = response.iter_lines()       # kept: a dropped line iterator closes the connection, an abort
        next(line for line in lines if line.startswith("data: "))
        short = threading.Thread(target=httpx.post, args=(server.url + "/v1/completions",),
                                 kwargs={"json": {"prompt": "Hi", "max_tokens": 2}, "timeout": 120})
        short.start()
        busy = wait_for(lambda: (d := loads(server))["loads"][0]["num_waiting_reqs"] == 1 and d, timeout_s=30)
        assert busy, loads(server)
        load = busy["loads"][0]
        assert (load["num_running_reqs"], load["num_total_reqs"]) == (1, 2)
        assert load["num_used_tokens"] > 0 and load["num_used_tokens"] % BLOCK_SIZE == 0
        assert load["token_usage"] == round(load["num_used_tokens"] / load["max_total_num_tokens"], 4)
        assert busy["aggregate"]["total_reqs"] == 2
    short.join(120)                         # the long one was aborted when its stream closed; the short one ran
    done = wait_for(lambda: (d := loads(server))["loads"][0]["num_total_reqs"] == 0 and d, timeout_s=10)
    assert done, loads(server)
    assert done["loads"][0]["num_used_tokens"] == 0


def test_gen_throughput_counts_the_tokens_generated_since_the_previous_report(server):
    loads(server)
    httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "ignore_eos": True},
               timeout=120)
    assert loads(server)["loads"][0]["gen_throughput"] > 0
    assert loads(server)["loads"][0]["gen_throughput"] == 0          # nothing generated since


def test_loads_refuse_unknown_sections_and_ranks_and_need_the_metrics_key(server):
    assert httpx.get(server.url + "/v1/loads").status_code == 401
    bad = httpx.get(server.url + "/v1/loads?include=core,everything", headers=KEY)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "include"
    assert "everything" in bad.json()["error"]["message"]
    assert httpx.get(server.url + "/v1/loads?dp_rank=1", headers=KEY).status_code == 400
    assert httpx.get(server.url + "/v1/loads?dp_rank=0", headers=KEY).status_code == 200

"""What tests/test_tensor_parallel.py runs inside MPI ranks (`mpiexec -n N python tests/tp_ranks.py CHECK ...`).

Every rank runs the same check; rank 0 prints one JSON object with what the test compares. Each check is the
SPMD form (every rank calls the same thing), so no driver loop is involved unless the check asks for one.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from minitransformer.parallel.communicator import MpiCommunicator


def collectives(comm: MpiCommunicator) -> dict:
    """all_reduce and broadcast on this rank's own numbers, against NumPy's sum of every rank's numbers."""
    def mine(rank: int) -> np.ndarray:                                     # (4, 5) float32, different per rank
        return np.random.default_rng(rank).normal(size=(4, 5)).astype(np.float32)

    summed = comm.all_reduce(mine(comm.rank))
    expected = np.sum([mine(r).astype(np.float64) for r in range(comm.world_size)], axis=0)
    ints = comm.all_reduce(np.full(3, comm.rank + 1, dtype=np.int64))
    obj = comm.broadcast({"from": comm.rank, "ids": [1, 2, 3]} if comm.rank == 0 else None)
    array = comm.broadcast_array(np.arange(6, dtype=np.float32) if comm.rank == 0 else np.zeros(6, np.float32))
    ok = (bool(np.allclose(summed, expected, rtol=1e-6, atol=1e-6))
          and ints.tolist() == [sum(range(1, comm.world_size + 1))] * 3
          and obj == {"from": 0, "ids": [1, 2, 3]} and array.tolist() == list(range(6)))
    all_ok = comm.all_reduce(np.array([int(ok)], dtype=np.int64))[0] == comm.world_size
    return {"world_size": comm.world_size, "all_ok": bool(all_ok), "stats": comm.stats.snapshot()}


def forward(comm: MpiCommunicator, path: str, steps: int) -> dict:
    """The sharded forward's logits (prefill, then greedy decode steps through the driver and the workers) next to
    one process's, on rank 0."""
    from minitransformer import load_model
    from minitransformer.core.generate import generate
    from minitransformer.core.sampling_params import SamplingParams
    from minitransformer.parallel.driver import tensor_parallel_rank

    ids = [[5, 60, 61, 7, 90, 33, 12, 70]]
    positions = [list(range(8))]
    with tensor_parallel_rank(lambda c: load_model(path, comm=c), lambda: comm) as driver:
        if driver is None:
            return {}
        whole = load_model(path)                                         # one process's model, on rank 0
        logits_tp, logits_one = driver.forward(ids, positions), whole.forward(ids, positions)   # (1, 8, V) each
        comm.stats.reset()
        params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
        tp = generate(driver, "the cat", params)
        reduces = comm.stats.snapshot().get("all_reduce", {})
        one = generate(whole, "the cat", params)
        return {"max_abs_diff": float(np.abs(logits_tp - logits_one).max()),
                "max_abs_logit": float(np.abs(logits_one).max()), "tokens_tp": tp.token_ids,
                "tokens_one": one.token_ids, "kv_bytes_tp": tp.kv_cache_bytes, "kv_bytes_one": one.kv_cache_bytes,
                "local_heads": [driver.config.n_heads, driver.config.n_kv_heads, driver.config.ffn_dim],
                "all_reduce_calls": reduces.get("calls", 0), "n_layers": driver.config.n_layers}


# Eight prompts sharing a prefix of several blocks: the later ones find it in the prefix cache.
ENGINE_PROMPTS = [f"Once upon a time there was a little robot who lived in a quiet town. Story {i}:" for i in range(8)]


def run_engine(model, max_tokens: int, num_blocks: int) -> dict:
    """8 concurrent greedy requests on an Engine over `model`, through a pool small enough to preempt, with
    prefix caching on and one request aborted mid-way: each request's token ids, and the counters that show the
    preemption and the prefix-cache hits happened."""
    from minitransformer.core.sampling_params import SamplingParams
    from minitransformer.serving import Engine

    engine = Engine(model, max_num_seqs=8, num_blocks=num_blocks, block_size=4, max_num_batched_tokens=48,
                    cuda_graphs=False)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(prompt, params, request_id=f"r{i}") for i, prompt in enumerate(ENGINE_PROMPTS)]
    tokens: dict[str, list[int]] = {rid: [] for rid in ids}
    finish: dict[str, str] = {}
    while engine.has_unfinished_requests():
        if engine.num_steps == 6:
            engine.abort("r7")
        for out in engine.step():
            tokens[out.request_id] += out.delta.token_ids
            if out.finished:
                finish[out.request_id] = str(out.delta.finish_reason)
    stats = engine.stats
    return {"tokens": tokens, "finish": finish, "preemptions": stats.num_preemptions,
            "prefix_hits": stats.prefix_cache_hits, "free_blocks": stats.num_free_blocks,
            "num_blocks": stats.num_blocks}


def engine(comm: MpiCommunicator, path: str, max_tokens: int, num_blocks: int) -> dict:
    """The serving engine on the driver model (every step's forward through the workers' pools) next to the same
    engine on one process's model, on rank 0."""
    from minitransformer import load_model
    from minitransformer.parallel.driver import tensor_parallel_rank

    with tensor_parallel_rank(lambda c: load_model(path, comm=c), lambda: comm) as driver:
        if driver is None:
            return {}
        comm.stats.reset()
        tp = run_engine(driver, max_tokens, num_blocks)
        broadcasts = comm.stats.snapshot().get("broadcast", {}).get("calls", 0)
        one = run_engine(load_model(path), max_tokens, num_blocks)
        return {"tp": tp, "one": one, "broadcasts": broadcasts}


def main() -> None:
    comm = MpiCommunicator()
    check = sys.argv[1]
    if check == "collectives":
        out = collectives(comm)
    elif check == "engine":
        out = engine(comm, sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        out = forward(comm, sys.argv[2], int(sys.argv[3]))
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

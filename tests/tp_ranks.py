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
    from minitransformer.generate import generate
    from minitransformer.loading import load_model
    from minitransformer.parallel.driver import tensor_parallel_rank
    from minitransformer.sampling_params import SamplingParams

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


def main() -> None:
    comm = MpiCommunicator()
    check = sys.argv[1]
    out = collectives(comm) if check == "collectives" else forward(comm, sys.argv[2], int(sys.argv[3]))
    if comm.rank == 0:
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

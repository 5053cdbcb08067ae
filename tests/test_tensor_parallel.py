"""Tensor parallelism (minitransformer/parallel/): the shard plan and its refusals, shard-only loading, the
communicator under mpiexec against NumPy, the sharded forward against one process, `generate
--tensor-parallel-size N` against size 1, and that no rank outlives a run, a killed rank or a signal.

Tolerance of the sharded logits: the all-reduce sums each layer's partial outputs in an order MPI chooses, not in
one dot product's order, so float32 rounding differs at every one of the 2 x layers sums; the differences stay
near float32's relative precision times the logits' scale (about 1e-6 of the largest logit on SmolLM2 and the
tiny model). The bound is the project's float32 tolerance, 1e-4 relative to the largest logit: loose enough for
any summation order, and a shard error (a wrong head, a wrong column block) moves logits by whole units.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import tiny_model as tiny
from minitransformer.core.config import ModelConfig
from minitransformer.core.errors import InputError
from minitransformer.core.gguf_file import dequantize, open_gguf
from minitransformer.parallel import communicator
from minitransformer.parallel.plan import ShardPlan, check_tensor_parallel_size, supported_sizes
from server_process import wait_for
from tiny_model import write_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
RANKS_SCRIPT = Path(__file__).with_name("tp_ranks.py")
LOGITS_RTOL = 1e-4            # of the largest logit (module docstring)

needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                               reason="mpi4py is not installed: pip install '.[parallel]' (CI installs it)")


def smollm_config(**changes) -> ModelConfig:
    """SmolLM2-135M's numbers (9 query heads, 3 KV heads, FFN 1536), without the file."""
    sizes = dict(name="SmolLM2-135M", n_layers=30, d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, ffn_dim=1536,
                 norm_eps=1e-5, rope_base=1e5, context_length=8192, vocab_size=49152, tied_embeddings=True)
    return ModelConfig(**{**sizes, **changes})


# ------------------------------------------------------------------------------------------- the plan, no MPI

def test_smollm2_splits_over_1_and_3_ranks_and_every_other_size_is_refused_with_its_head_counts():
    config = smollm_config()
    assert supported_sizes(config) == [1, 3]
    for size, what in ((2, "query heads"), (4, "query heads"), (9, "feed-forward"), (0, ">= 1")):
        with pytest.raises(InputError, match=what) as refused:
            check_tensor_parallel_size(config, size)
        if size:
            assert "9 query heads, 3 KV heads and FFN 1536" in str(refused.value)
            assert "sizes that work: 1, 3" in str(refused.value)


def test_kv_heads_that_cannot_divide_and_cannot_be_replicated_evenly_are_refused():
    config = smollm_config(n_heads=12, n_kv_heads=3, d_model=768)     # 2 ranks: 3 KV heads split neither way
    with pytest.raises(InputError, match="cannot split the KV heads.*12 query heads, 3 KV heads"):
        check_tensor_parallel_size(config, 2)


@pytest.mark.parametrize("heads,kv_heads,ffn", [(9, 3, 1536), (8, 2, 64), (8, 8, 64), (12, 4, 96), (6, 1, 60)])
def test_every_rank_holds_the_kv_heads_its_query_heads_read_and_the_spans_tile_each_dimension(heads, kv_heads, ffn):
    config = smollm_config(n_heads=heads, n_kv_heads=kv_heads, ffn_dim=ffn, d_model=heads * 64)
    for size in supported_sizes(config):
        plans = [ShardPlan(config, size, rank) for rank in range(size)]
        for name in ("q_dim", "ffn_dim"):                      # split without overlap, in rank order
            covered = [i for plan in plans for i in range(getattr(config, name))[plan.span(name)]]
            assert covered == list(range(getattr(config, name)))
        for plan in plans:
            local = plan.shard_config()
            assert local.n_heads * size == heads and local.ffn_dim * size == ffn
            q_heads = range(plan.span("q_dim").start // 64, plan.span("q_dim").stop // 64)
            kv_heads_held = range(plan.first_kv_head, plan.first_kv_head + local.n_kv_heads)
            # GQA: query head j reads KV head j // group; this rank's j // group, counted from its first KV head,
            # is the local KV head index the forward uses (local j // local group)
            assert [j // config.group_size for j in q_heads] == [
                kv_heads_held[i // local.group_size] for i in range(local.n_heads)]
        replicas = max(1, size // kv_heads)
        assert [p.first_kv_head for p in plans].count(0) == replicas


# ------------------------------------------------------------------------------------------- shard-only loading

@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.0.ffn_down.weight", "token_embd.weight",
                                  "blk.0.attn_output.weight"])
def test_dequantizing_rows_or_columns_equals_slicing_the_whole_tensor(tiny_model_path, name):
    tensor = next(t for t in open_gguf(tiny_model_path).tensors if t.name == name)    # Q4_1, Q4_1, Q8_0, F32
    whole = dequantize(tensor)                                                         # (out, in)
    out, inputs = whole.shape
    np.testing.assert_array_equal(dequantize(tensor, rows=slice(out // 4, out // 2)), whole[out // 4:out // 2])
    for columns in (slice(32, 64), slice(0, inputs // 2), slice(8, 40)):   # block-aligned, and one that cuts a block
        np.testing.assert_array_equal(dequantize(tensor, columns=columns), whole[:, columns])


# ------------------------------------------------------------------------------------------- NCCL without a GPU

def test_the_nccl_dtype_table_and_the_one_gpu_per_rank_refusal():
    names = [communicator.nccl_dtype_name(dtype) for dtype in (np.float32, np.float16, "int64")]
    assert names == ["NCCL_FLOAT32", "NCCL_FLOAT16", "NCCL_INT64"]
    with pytest.raises(InputError, match="complex64"):
        communicator.nccl_dtype_name(np.complex64)
    with pytest.raises(InputError, match="one GPU per rank: 2 ranks asked, 1 GPU on this machine"):
        communicator.check_gpus_for_ranks(2, 1)
    communicator.check_gpus_for_ranks(2, 2)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="CuPy is installed: nothing to refuse")
def test_nccl_without_cupy_says_which_extra_brings_it():
    with pytest.raises(InputError, match="CuPy"):
        communicator.NcclCommunicator(control=mock.Mock(rank=0, world_size=1))


def test_collective_stats_count_calls_bytes_and_seconds():
    stats = communicator.CollectiveStats()
    stats.add("all_reduce", 2304, 0.5)
    stats.add("all_reduce", 2304, 0.25)
    assert stats.snapshot() == {"all_reduce": {"calls": 2, "bytes": 4608, "seconds": 0.75}}
    stats.reset()
    assert stats.snapshot() == {}


# ------------------------------------------------------------------------------------------- processes

@pytest.fixture
def process_tag(monkeypatch):
    """A tag every process this test starts inherits (mpiexec passes the environment to its ranks); afterwards
    no process may still carry it."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv("MINITRANSFORMER_TEST_TAG", tag)
    yield tag
    deadline = time.monotonic() + 15
    while tagged_processes(tag) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert tagged_processes(tag) == [], "processes left running after the test"


def tagged_processes(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if f"MINITRANSFORMER_TEST_TAG={tag}".encode() in environ.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def mpiexec(n: int, *args: str, timeout: float = 240) -> dict:
    """Run tests/tp_ranks.py as n ranks; rank 0's JSON."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    mpiexec = Path(sys.executable).parent / "mpiexec"
    done = subprocess.run([str(mpiexec), "-n", str(n), sys.executable, str(RANKS_SCRIPT), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-2000:]
    return json.loads(done.stdout)


def cli(*args: str, timeout: float = 300, **popen) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "minitransformer", *args], capture_output=True, text=True,
                          timeout=timeout, **popen)


@pytest.fixture(scope="module")
def six_head_path(tmp_path_factory):
    """The tiny model with 6 query heads sharing 3 KV heads, FFN 192: it splits over 3 ranks (and 6, replicating
    each KV head twice), like SmolLM2's 9 and 3."""
    dims = {**tiny.DIMS, "d_model": 96, "n_heads": 6, "n_kv_heads": 3, "head_dim": 16, "ffn_dim": 192}
    with mock.patch.object(tiny, "DIMS", dims):
        return write_tiny_llama(tmp_path_factory.mktemp("tp") / "tiny-6-heads.gguf")


@needs_mpi
@pytest.mark.parametrize("size", [2, 3])
def test_all_reduce_and_broadcast_match_numpy_under_mpiexec(size, process_tag):
    out = mpiexec(size, "collectives")
    assert out["world_size"] == size and out["all_ok"]
    assert out["stats"]["all_reduce"]["calls"] == 3 and out["stats"]["broadcast_array"]["bytes"] == 24


def check_sharded_run(out: dict, size: int, local: list[int], kv_share: float) -> None:
    assert out["max_abs_diff"] <= LOGITS_RTOL * out["max_abs_logit"], out
    assert out["tokens_tp"] == out["tokens_one"]
    assert out["local_heads"] == local                          # this rank's query heads, KV heads, FFN columns
    assert out["kv_bytes_tp"] == out["kv_bytes_one"] * kv_share  # each rank's cache holds only its KV heads
    # two per layer per forward (prefill + 5 decodes); none in a world of one, where the forward skips them
    assert out["all_reduce_calls"] == (2 * out["n_layers"] * 6 if size > 1 else 0)


@needs_mpi
@pytest.mark.parametrize("size,local,kv_share", [(1, [6, 3, 192], 1), (3, [2, 1, 64], 1 / 3),
                                                 (6, [1, 1, 32], 1 / 3)])
def test_sharded_forward_matches_one_process_on_the_tiny_model(six_head_path, size, local, kv_share, process_tag):
    check_sharded_run(mpiexec(size, "forward", str(six_head_path), "6"), size, local, kv_share)


@needs_mpi
def test_sharded_forward_matches_one_process_on_smollm2(real_model_path, process_tag):
    check_sharded_run(mpiexec(3, "forward", str(real_model_path), "6", timeout=600), 3, [3, 1, 512], 1 / 3)


@needs_mpi
def test_generate_at_size_3_gives_the_tokens_of_size_1_on_the_tiny_model(six_head_path, process_tag):
    runs = [cli("generate", "the cat sat", "--model", str(six_head_path), "--max-tokens", "12", "--ignore-eos",
                "--json", "--tensor-parallel-size", str(n)) for n in (1, 3)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    one, three = (json.loads(run.stdout) for run in runs)                # stdout is exactly one JSON object
    assert three["token_ids"] == one["token_ids"] and len(one["token_ids"]) == 12
    assert three["kv_cache"]["bytes"] * 3 == one["kv_cache"]["bytes"]   # rank 0's cache: 1 of the 3 KV heads


@needs_mpi
def test_generate_at_size_3_gives_the_tokens_of_size_1_on_smollm2(real_model_path, process_tag):
    runs = [cli("generate", "The capital of France is", "--max-tokens", "32", "--json", "--tensor-parallel-size",
                str(n), timeout=600) for n in (1, 3)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    one, three = (json.loads(run.stdout) for run in runs)
    assert three["token_ids"] == one["token_ids"]


@needs_mpi
def test_gemma3_at_size_2_gives_the_tokens_of_size_1(gemma_model_path, process_tag):
    """Gemma 3 270M (4 query heads, 1 KV head replicated on both ranks, sandwich norms applied after the
    all-reduce, sliding-window layers) splits over 2 ranks with the tokens of one process."""
    runs = [cli("generate", "The capital of France is", "--model", str(gemma_model_path), "--max-tokens", "12",
                "--ignore-eos", "--json", "--tensor-parallel-size", str(n), timeout=600) for n in (1, 2)]
    for run in runs:
        assert run.returncode == 0, run.stderr
    one, two = (json.loads(run.stdout) for run in runs)
    assert two["token_ids"] == one["token_ids"] and len(one["token_ids"]) == 12


@pytest.mark.parametrize("size", ["2", "4", "0"])
def test_a_size_that_cannot_split_the_heads_is_exit_2_with_the_head_counts(six_head_path, size, process_tag):
    run = cli("generate", "hi", "--model", str(six_head_path), "--tensor-parallel-size", size)
    assert run.returncode == 2 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("minitransformer: error: --tensor-parallel-size")
    if size != "0":
        assert "6 query heads, 3 KV heads and FFN 192" in lines[0] and "sizes that work: 1, 3, 6" in lines[0]


@needs_mpi
def test_an_error_on_rank_0_is_its_one_line_and_exit_code_and_stops_the_workers(six_head_path, process_tag):
    run = cli("generate", "the cat " * 100, "--model", str(six_head_path), "--max-tokens", "4",
              "--tensor-parallel-size", "3")
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [
        "minitransformer: error: prompt (more than 124 tokens) + max_tokens (4) exceeds the context length of 128 "
        "tokens"]


def test_smollm2_at_size_2_is_refused_naming_9_query_heads(real_model_path, process_tag):
    run = cli("generate", "hi", "--model", str(real_model_path), "--tensor-parallel-size", "2")
    assert run.returncode == 2 and "9 query heads, 3 KV heads and FFN 1536" in run.stderr


def start_streaming(model: Path, max_tokens: int, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """`generate --tensor-parallel-size 3` streaming text; returns once the first text has arrived on stdout."""
    process = subprocess.Popen([sys.executable, "-m", "minitransformer", "generate", "Once upon a time",
                                "--model", str(model), "--max-tokens", str(max_tokens), "--ignore-eos",
                                "--tensor-parallel-size", "3", *extra],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout is not None
    first = process.stdout.read1(1)          # type: ignore[attr-defined]
    assert first, process.stderr.read().decode() if process.stderr else ""
    return process


def worker_pids(supervisor: int) -> list[int]:
    """The ranks other than 0 that `supervisor` started (PMI_RANK is Hydra's name for a rank's number)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes().split(b"\0") if entry.name.isdigit() else []
        except OSError:
            continue
        if f"MINITRANSFORMER_TP_SUPERVISOR={supervisor}".encode() in environ and b"PMI_RANK=0" not in environ \
                and any(v.startswith(b"PMI_RANK=") for v in environ):
            pids.append(int(entry.name))
    return pids


@needs_mpi
def test_a_killed_worker_ends_the_request_with_an_error_within_seconds(real_model_path, process_tag):
    process = start_streaming(real_model_path, 400)
    workers = worker_pids(process.pid)
    assert len(workers) == 2
    rank = next(v for v in Path(f"/proc/{workers[0]}/environ").read_bytes().split(b"\0") if v.startswith(b"PMI_RANK="))
    os.kill(workers[0], signal.SIGKILL)
    killed_at = time.monotonic()
    _, stderr = process.communicate(timeout=30)
    assert time.monotonic() - killed_at < 15
    assert process.returncode == 1
    lines = stderr.decode().strip().splitlines()
    assert lines[-1].startswith(f"minitransformer: error: tensor-parallel rank {rank.split(b'=')[1].decode()} died"), \
        lines
    assert b"BAD TERMINATION" not in stderr and not any(set(line) == {"="} for line in lines)


@needs_mpi
@pytest.mark.parametrize("sent,code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_or_ctrl_c_on_the_command_stops_every_rank(real_model_path, sent, code, process_tag):
    process = start_streaming(real_model_path, 400)
    process.send_signal(sent)
    process.communicate(timeout=30)
    assert process.returncode == code


@needs_mpi
def test_ranks_exit_when_the_command_itself_is_killed(real_model_path, process_tag):
    process = start_streaming(real_model_path, 400)
    process.kill()                                # no chance to stop anything: the ranks watch its pid
    process.wait(timeout=10)                      # the fixture then checks that every rank is gone


@needs_mpi
def test_ranks_exit_when_the_command_is_killed_and_its_parent_has_not_reaped_it(real_model_path, process_tag):
    """A SIGKILLed supervisor that its parent (here, this test) has not waited for is a zombie, on which
    os.kill(pid, 0) still succeeds: the ranks read its state instead, and exit as if it were gone."""
    process = start_streaming(real_model_path, 400)
    process.kill()
    try:
        assert wait_for(lambda: tagged_processes(process_tag) == [], 15), tagged_processes(process_tag)
    finally:
        process.wait(timeout=10)

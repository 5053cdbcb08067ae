"""`--tensor-parallel-size N` on the command line: the same command runs again as N MPI ranks (parallel/launch.py),
each loading its shard; rank 0 runs the loop with the driver model, the others serve its forwards (lesson 15).

Kept apart from options.py, which only spells and checks the flags: this is how the command becomes N processes.
"""

from __future__ import annotations

import contextlib

from ..core.errors import InputError
from .options import load_model_from_args


@contextlib.contextmanager
def model_for_args(args):
    """The model generate runs: loaded here, or, inside a tensor-parallel rank (parallel/launch.py), this rank's
    shard; rank 0 gets the driver model, a worker gets None once rank 0 has stopped it (its work is done)."""
    from ..parallel.launch import in_rank_process

    if not in_rank_process():
        yield load_model_from_args(args)
        return
    from ..parallel.communicator import MpiCommunicator, NcclCommunicator
    from ..parallel.driver import tensor_parallel_rank

    def communicator():
        mpi = MpiCommunicator()
        return NcclCommunicator(mpi) if args.device == "gpu" else mpi

    with tensor_parallel_rank(lambda comm: load_model_from_args(args, comm), communicator) as model:
        yield model


def add_tensor_parallel_option(parser) -> None:
    """--tensor-parallel-size, as generate and serve spell it."""
    parser.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                        help="split the model over N processes (MPI ranks started and stopped here; the 'parallel' "
                             "extra), each holding 1/N of the heads and FFN columns (lesson 15); default 1")


def launch_tensor_parallel(args, drain_s: float | None = None) -> int | None:
    """--tensor-parallel-size N > 1: refuse what cannot run before any process starts (exit 2 with the model's
    head counts), then run this same command as N ranks (parallel/launch.py) and return rank 0's exit code.
    None when this process runs the model itself: size 1, or already one of the ranks. drain_s: on a signal, rank 0
    alone is asked to stop and may take this long to end the job (serve drains its requests; run_ranks)."""
    from ..core.config import ModelConfig
    from ..parallel.communicator import check_gpus_for_ranks
    from ..parallel.launch import in_rank_process, run_ranks

    if args.tensor_parallel_size == 1 or in_rank_process():
        return None
    from ..core.gguf_file import open_gguf
    from ..models import resolve_model_path
    from ..parallel.plan import check_tensor_parallel_size

    size = args.tensor_parallel_size
    check_tensor_parallel_size(ModelConfig.from_gguf(open_gguf(resolve_model_path(args.model))), size)
    if getattr(args, "speculative", None) is not None:
        raise InputError("--speculative with --tensor-parallel-size is not supported yet; use one or the other")
    if args.weights != "f32":
        raise InputError(f"--tensor-parallel-size splits float32 weights; --weights {args.weights} is not split yet")
    if args.device == "gpu":
        import cupy
        check_gpus_for_ranks(size, cupy.cuda.runtime.getDeviceCount())
    return run_ranks(args.argv, size, drain_s=drain_s)

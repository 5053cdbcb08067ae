"""The collectives tensor parallelism needs, behind one small interface, with a counter of what they cost.

    all_reduce(array)      sum over the ranks, in place: every rank ends with the sum (the model's two per layer)
    broadcast(obj)         a picklable object from rank 0 to every rank (the driver's step message)
    broadcast_array(a)     an array from rank 0, in place
    barrier()              wait until every rank is here
    abort()                end every rank of the job (a rank that cannot go on)
    rank, world_size       who this process is, how many there are
    stats                  CollectiveStats: calls, bytes and seconds per collective (lesson 15 reads them)

Two implementations, as vLLM keeps one device communicator per kind of hardware: MpiCommunicator (mpi4py over the
MPICH wheel: NumPy buffers, CPU processes) and NcclCommunicator (cupy.cuda.nccl: CuPy buffers, one GPU per rank;
it keeps the MPI one for host objects and the start-up handshake). The model only ever calls `all_reduce`, so it
cannot tell which library is underneath. A single process has no communicator at all (model.comm is None), so the
plain path pays nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..core.errors import InputError
from ..core.metrics import now

PARALLEL_EXTRA_HINT = "install the parallel extra: pip install 'minitransformer[parallel]' (mpi4py and MPICH)"


@dataclass
class CollectiveCount:
    """One collective's running totals on this rank: how often, how many bytes of payload, how long it waited."""
    calls: int = 0
    bytes: int = 0
    seconds: float = 0.0


@dataclass
class CollectiveStats:
    """Per-collective counters, kept by every communicator (lesson 15: all-reduces per token, bytes, time).

    Seconds are wall time inside the call, waiting for the slowest rank included: that wait is part of what a
    collective costs. reset() before a measured run, snapshot() after it.
    """
    counts: dict[str, CollectiveCount] = field(default_factory=dict)

    def add(self, name: str, nbytes: int, seconds: float) -> None:
        count = self.counts.setdefault(name, CollectiveCount())
        count.calls += 1
        count.bytes += nbytes
        count.seconds += seconds

    def snapshot(self) -> dict[str, dict[str, float]]:
        return {name: {"calls": c.calls, "bytes": c.bytes, "seconds": c.seconds} for name, c in self.counts.items()}

    def reset(self) -> None:
        self.counts.clear()


class Communicator(Protocol):
    """What the model, the loader and the driver ask of a group of ranks (module docstring)."""
    rank: int
    world_size: int
    stats: CollectiveStats

    def all_reduce(self, array: Any) -> Any: ...

    def broadcast(self, obj: Any = None) -> Any: ...

    def broadcast_array(self, array: Any) -> Any: ...

    def barrier(self) -> None: ...

    def abort(self, code: int = 1) -> None: ...


def import_mpi():
    """mpi4py's MPI module (initialising MPI), or one InputError that says how to get it."""
    try:
        from mpi4py import MPI
    except ImportError:
        raise InputError(f"tensor parallelism needs mpi4py; {PARALLEL_EXTRA_HINT}") from None
    return MPI


class MpiCommunicator:
    """The collectives through mpi4py on NumPy arrays (MPI_COMM_WORLD of the job mpiexec started by default).

    Upper-case mpi4py calls (Allreduce, Bcast) move the array's memory directly; lower-case ones (bcast) pickle a
    Python object, which is what the step message is. MPI's sum over 3 ranks adds the partials in an order of its
    choosing, so a sharded forward is not bit-identical to one process (tests/test_tensor_parallel.py: tolerance).
    """

    def __init__(self, comm=None):
        MPI = import_mpi()
        self._MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.world_size = self.comm.Get_rank(), self.comm.Get_size()
        self.stats = CollectiveStats()

    def all_reduce(self, array):
        """Sum `array` (a C-contiguous NumPy array) over the ranks, in place; returns it."""
        start = now()
        self.comm.Allreduce(self._MPI.IN_PLACE, array, op=self._MPI.SUM)
        self.stats.add("all_reduce", array.nbytes, now() - start)
        return array

    def broadcast(self, obj=None):
        """Rank 0's `obj` on every rank (pickled; the others pass None)."""
        start = now()
        obj = self.comm.bcast(obj, root=0)
        self.stats.add("broadcast", 0, now() - start)   # pickled size unknown here: bytes stay 0
        return obj

    def broadcast_array(self, array):
        """Rank 0's array copied into `array` on every rank (same shape and dtype everywhere); returns it."""
        start = now()
        self.comm.Bcast(array, root=0)
        self.stats.add("broadcast_array", array.nbytes, now() - start)
        return array

    def barrier(self) -> None:
        self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (MPI_Abort): what a rank that cannot go on does, so no rank waits for it."""
        self.comm.Abort(code)


# cupy.cuda.nccl's name for each NumPy dtype the model sends (looked up by name, so this table reads, and is
# tested, without CuPy).
NCCL_DTYPES = {"float32": "NCCL_FLOAT32", "float16": "NCCL_FLOAT16", "float64": "NCCL_FLOAT64",
               "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "int64": "NCCL_INT64"}


def nccl_dtype_name(dtype) -> str:
    """The NCCL data type name of a NumPy/CuPy dtype, or an InputError naming the ones NCCL is given here."""
    import numpy as np

    name = np.dtype(dtype).name
    if name not in NCCL_DTYPES:
        raise InputError(f"NCCL collectives here take {', '.join(NCCL_DTYPES)}; got {name}")
    return NCCL_DTYPES[name]


def check_gpus_for_ranks(world_size: int, gpus: int) -> None:
    """One NCCL rank per GPU: two ranks cannot share one GPU (NCCL refuses a duplicate device in a communicator),
    so a size above the number of GPUs is refused here with both numbers."""
    if world_size > gpus:
        raise InputError(f"tensor parallelism over NCCL needs one GPU per rank: {world_size} ranks asked, "
                         f"{gpus} GPU{'s' if gpus != 1 else ''} on this machine (use --device cpu for MPI ranks)")


class NcclCommunicator:
    """The collectives through NCCL (cupy.cuda.nccl) on CuPy arrays; host objects still go through `control`.

    Rank r drives GPU r. The NCCL communicator is built from a unique id that rank 0 makes and sends to the others
    over MPI: NCCL has no launcher of its own, so the MPI job that started the ranks also introduces them.
    device_count is for tests (the refusal), defaulting to CUDA's count.
    """

    def __init__(self, control: MpiCommunicator, device_count: Callable[[], int] | None = None):
        try:
            import cupy
            from cupy.cuda import nccl
        except ImportError:
            raise InputError("NCCL collectives need CuPy with NCCL; install the gpu extra") from None
        self.control, self.rank, self.world_size = control, control.rank, control.world_size
        count = device_count or cupy.cuda.runtime.getDeviceCount
        check_gpus_for_ranks(self.world_size, count())
        cupy.cuda.Device(self.rank).use()
        unique_id = control.broadcast(nccl.get_unique_id() if self.rank == 0 else None)
        self._cupy, self._nccl = cupy, nccl
        self.comm = nccl.NcclCommunicator(self.world_size, unique_id, self.rank)
        self.stats = CollectiveStats()

    def _stream(self) -> int:
        return self._cupy.cuda.get_current_stream().ptr

    def _dtype(self, array) -> int:
        return getattr(self._nccl, nccl_dtype_name(array.dtype))

    def all_reduce(self, array):
        """Sum a C-contiguous CuPy array over the ranks, in place (NCCL accepts send == receive buffer)."""
        start = now()
        self.comm.allReduce(array.data.ptr, array.data.ptr, array.size, self._dtype(array), self._nccl.NCCL_SUM,
                            self._stream())
        self.stats.add("all_reduce", array.nbytes, now() - start)   # enqueue time: the GPU is async
        return array

    def broadcast(self, obj=None):
        return self.control.broadcast(obj)

    def broadcast_array(self, array):
        start = now()
        self.comm.bcast(array.data.ptr, array.size, self._dtype(array), 0, self._stream())
        self.stats.add("broadcast_array", array.nbytes, now() - start)
        return array

    def barrier(self) -> None:
        self._cupy.cuda.get_current_stream().synchronize()
        self.control.barrier()

    def abort(self, code: int = 1) -> None:
        self.control.abort(code)

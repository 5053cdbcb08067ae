"""What the CPU emulation costs: milliseconds per __syncthreads, per warp shuffle and per block launch.

Why a file of its own: it is a measurement made with the runner, not part of it (it builds a small module through
CpuModule like any caller). `python -m minitransformer.lab.kernel_overheads` prints the table for every mode and
order.
"""

from __future__ import annotations

import numpy as np

from ..kernels.cpu_runner import DEFAULT_ORDER, MODES, ORDERS, CpuModule

# ---- what the emulation costs ----------------------------------------------------------------------------------------

_OVERHEAD_SOURCE = r"""
extern "C" __global__ void barriers(int n) { for (int i = 0; i < n; ++i) __syncthreads(); }
extern "C" __global__ void shuffles(float* out, int n) {
    float v = float(threadIdx.x);
    for (int i = 0; i < n; ++i) v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}
extern "C" __global__ void nothing() {}
"""


def measure_overheads(mode: str = "fibers", threads: int = 128, repeats: int = 200,
                      order: str = DEFAULT_ORDER) -> dict[str, float]:
    """Milliseconds per __syncthreads, per warp shuffle (all lanes of every warp) and per block launch, for a block
    of `threads`: what a kernel's running time on the CPU is made of besides its own arithmetic. Each launch is
    timed by measure.time_calls (a warm-up, then the fastest of 3: the cost without the machine's other work)."""
    from .measure import time_calls
    module = CpuModule(_OVERHEAD_SOURCE, mode=mode, order=order, source_name="overheads.cu")

    def timed(name: str, grid: int, args: tuple) -> float:
        kernel = module.get_function(name)
        return time_calls(lambda: kernel((grid,), (threads,), args), repeats=3).min * 1e3

    out = np.zeros(threads, np.float32)
    block = timed("nothing", repeats, ()) / repeats
    return {"block_ms": block,
            "barrier_ms": (timed("barriers", 1, (np.int32(repeats),)) - block) / repeats,
            "shuffle_ms": (timed("shuffles", 1, (out, np.int32(repeats))) - block) / repeats}


if __name__ == "__main__":
    for mode in MODES:
        for order in ORDERS:
            costs = measure_overheads(mode, order=order)
            print(f"{mode:8s} {order:8s} 128 threads: " + ", ".join(f"{k} {v:.4f}" for k, v in costs.items()))

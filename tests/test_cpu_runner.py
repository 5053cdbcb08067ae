"""The CPU runner for CUDA kernels: results against NumPy / torch, and the bugs it must catch (kernels_planted/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from minitransformer.core.errors import MiniTransformerError
from minitransformer.kernels.cpu_runner import DEFAULT_ORDER, ORDERS, CpuModule, KernelError
from minitransformer.lab.kernel_overheads import measure_overheads

PLANTED = Path(__file__).parent / "kernels_planted"
MODES = ["fibers", "threads"]

REDUCE = r"""
#include <cuda_fp16.h>
// One partial sum per block: a grid-stride loop, then a tree reduction in shared memory.
extern "C" __global__ void block_sum(const float* __restrict__ x, float* __restrict__ out, int n) {
    __shared__ float partial[256];
    const int t = threadIdx.x;
    float s = 0.0f;
    for (int i = blockIdx.x * blockDim.x + t; i < n; i += blockDim.x * gridDim.x) s += x[i];
    partial[t] = s;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride) partial[t] += partial[t + stride];
        __syncthreads();
    }
    if (t == 0) out[blockIdx.x] = partial[0];
}

// C = A @ B with 16x16 tiles of A and B staged in shared memory; 2-D blocks and grid; any M, N, K.
extern "C" __global__ void tiled_matmul(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float a[16][16];
    __shared__ float b[16][16];
    const int row = blockIdx.y * 16 + threadIdx.y, col = blockIdx.x * 16 + threadIdx.x;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += 16) {
        a[threadIdx.y][threadIdx.x] = row < M && k0 + threadIdx.x < K ? A[row * K + k0 + threadIdx.x] : 0.0f;
        b[threadIdx.y][threadIdx.x] = col < N && k0 + threadIdx.y < K ? B[(k0 + threadIdx.y) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < 16; ++k) acc += a[threadIdx.y][k] * b[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

// A template: each block scales one row by a compile-time factor through dynamic shared memory.
template <typename T, int FACTOR>
__global__ void scale_rows(const T* x, float* out, int cols) {
    extern __shared__ float row[];
    for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] = float(x[blockIdx.x * cols + c]) * FACTOR;
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) out[blockIdx.x * cols + c] = row[cols - 1 - c];
}
"""

WARP = r"""
// Every lane gets the sum of its warp (xor butterfly) and of the lanes below it (inclusive scan with shfl_up).
extern "C" __global__ void warp_ops(const float* x, float* total, float* scan, float* down, float* bcast) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
    const float v = x[i];
    float s = v;
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_xor_sync(0xffffffffu, s, offset);
    total[i] = s;
    float p = v;
    for (int offset = 1; offset < 32; offset *= 2) {
        const float up = __shfl_up_sync(0xffffffffu, p, offset);
        if (lane >= offset) p += up;
    }
    scan[i] = p;
    float d = v;
    for (int offset = 4; offset > 0; offset /= 2) d += __shfl_down_sync(0xffffffffu, d, offset, 8);
    down[i] = d;                          // lane 8g holds the sum of its group of 8
    bcast[i] = __shfl_sync(0xffffffffu, v, 5);
}

extern "C" __global__ void vote(const int* x, unsigned* ballot, int* any, int* all) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned b = __ballot_sync(0xffffffffu, x[i] > 0);
    if (threadIdx.x % 32 == 0) ballot[i / 32] = b;
    any[i] = __any_sync(0xffffffffu, x[i] > 0);
    all[i] = __all_sync(0xffffffffu, x[i] > 0);
}

extern "C" __global__ void histogram(const int* x, int* counts, float* sum, int* maximum, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        atomicAdd(&counts[x[i] % 8], 1);
        atomicAdd(sum, float(x[i]));
        atomicMax(maximum, x[i]);
    }
}
"""

HALF = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void half_to_float(const __half* in, float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __half2float(in[i]);
}
extern "C" __global__ void float_to_half(const float* in, __half* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = __float2half_rn(in[i]);
}
extern "C" __global__ void bf16_round_trip(const float* in, __nv_bfloat16* out, float* back, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = __float2bfloat16(in[i]);
        back[i] = __bfloat162float(out[i]);
    }
}
"""


@pytest.fixture(scope="module", params=MODES)
def reduce_module(request):
    return CpuModule(REDUCE, name_expressions=["scale_rows<float, 3>", "scale_rows<__half, 2>"],
                     mode=request.param, source_name="reduce.cu")


def planted(name: str, mode: str = "fibers", order: str = DEFAULT_ORDER) -> CpuModule:
    path = PLANTED / name
    return CpuModule(path.read_text(), mode=mode, order=order, source_name=path.name)


def line_of(name: str, marker: str, nth: int = 0) -> int:
    """The 1-based line of the nth occurrence of `marker` in a planted file."""
    lines = [i + 1 for i, text in enumerate((PLANTED / name).read_text().splitlines()) if marker in text]
    return lines[nth]


# ---- results against NumPy ---------------------------------------------------------------------------------------

def test_block_reduction_matches_numpy(reduce_module):
    x = np.random.default_rng(0).standard_normal(5000).astype(np.float32)    # (n,)
    partial = np.zeros(7, np.float32)                                          # (blocks,)
    reduce_module.get_function("block_sum")((7,), (256,), (x, partial, np.int32(x.size)))
    assert partial.sum() == pytest.approx(float(x.astype(np.float64).sum()), abs=1e-3)
    stride = 7 * 256                        # the grid-stride loop: block b owns elements i with (i // 256) % 7 == b
    owner = (np.arange(x.size) % stride) // 256
    np.testing.assert_allclose(partial, [x[owner == b].sum() for b in range(7)], rtol=1e-5, atol=1e-5)


def test_tiled_matmul_matches_numpy(reduce_module):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((37, 29)).astype(np.float32)       # (M, K): neither a multiple of the 16x16 tile
    b = rng.standard_normal((29, 45)).astype(np.float32)       # (K, N)
    c = np.full((37, 45), np.nan, np.float32)
    grid = ((45 + 15) // 16, (37 + 15) // 16)
    reduce_module.get_function("tiled_matmul")(grid, (16, 16), (a, b, c, np.int32(37), np.int32(45), np.int32(29)))
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_template_name_expression_and_dynamic_shared(reduce_module):
    x = np.random.default_rng(2).standard_normal((5, 70)).astype(np.float32)   # (rows, cols)
    out = np.zeros_like(x)
    reduce_module.get_function("scale_rows<float, 3>")((5,), (32,), (x, out, np.int32(70)), shared_mem=70 * 4)
    np.testing.assert_array_equal(out, (x * 3)[:, ::-1])
    xh = x.astype(np.float16)
    reduce_module.get_function("scale_rows<__half, 2>")((5,), (32,), (xh, out, np.int32(70)), shared_mem=70 * 4)
    np.testing.assert_array_equal(out, (xh.astype(np.float32) * 2)[:, ::-1])


def test_name_expression_not_given_up_front_is_compiled_on_demand(reduce_module):
    x = np.ones((2, 8), np.float32)
    out = np.zeros_like(x)
    reduce_module.get_function("scale_rows<float, 5>")((2,), (8,), (x, out, np.int32(8)), shared_mem=32)
    assert (out == 5).all()


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", MODES)
def test_warp_shuffles_match_numpy(mode, order):
    """A collective completes only when every lane of its mask has arrived, whatever order the lanes arrive in."""
    kernel = CpuModule(WARP, mode=mode, order=order, seed=3, source_name="warp.cu").get_function("warp_ops")
    x = np.random.default_rng(3).standard_normal(128).astype(np.float32)       # (4 warps * 32,)
    total, scan, down, bcast = (np.zeros_like(x) for _ in range(4))
    kernel((2,), (64,), (x, total, scan, down, bcast))
    warps = x.reshape(4, 32)
    np.testing.assert_allclose(total, np.repeat(warps.sum(1), 32), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(scan, np.cumsum(warps, 1).ravel(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(down.reshape(16, 8)[:, 0], x.reshape(16, 8).sum(1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(bcast, np.repeat(warps[:, 5], 32))


@pytest.mark.parametrize("order", ORDERS)
def test_shuffle_from_a_lane_that_does_not_exist_is_poison(order):
    kernel = CpuModule(WARP, order=order, source_name="warp.cu").get_function("warp_ops")
    x = np.ones(48, np.float32)             # one block of 48 threads: warp 1 has lanes 0-15 only
    total, scan, down, bcast = (np.zeros_like(x) for _ in range(4))
    kernel((1,), (48,), (x, total, scan, down, bcast))
    assert (total[:32] == 32).all() and np.isnan(total[32:]).all()   # the butterfly reads lanes 16-31 of warp 1
    np.testing.assert_array_equal(scan[32:], np.arange(1, 17))       # shfl_up reads only lanes below: defined


@pytest.mark.parametrize("order", ORDERS)
def test_vote_and_atomics(order):
    module = CpuModule(WARP, order=order, source_name="warp.cu")
    x = np.random.default_rng(4).integers(-3, 40, 96).astype(np.int32)        # (3 warps * 32,)
    x[64:] = np.abs(x[64:]) + 1                                                 # warp 2: all positive
    ballot, any_, all_ = np.zeros(3, np.uint32), np.zeros(96, np.int32), np.zeros(96, np.int32)
    module.get_function("vote")((1,), (96,), (x, ballot, any_, all_))
    expected = [sum(1 << j for j in range(32) if x[32 * w + j] > 0) for w in range(3)]
    np.testing.assert_array_equal(ballot, np.array(expected, np.uint32))
    np.testing.assert_array_equal(all_, np.repeat((x.reshape(3, 32) > 0).all(1), 32))
    np.testing.assert_array_equal(any_, np.repeat((x.reshape(3, 32) > 0).any(1), 32))
    values = np.abs(x)
    counts, total, maximum = np.zeros(8, np.int32), np.zeros(1, np.float32), np.full(1, -1, np.int32)
    module.get_function("histogram")((3,), (16,), (values, counts, total, maximum, np.int32(values.size)))
    np.testing.assert_array_equal(counts, np.bincount(values % 8, minlength=8))
    assert total[0] == values.sum() and maximum[0] == values.max()


BUILTINS = r"""
// Where every thread of a 3-D block in a 3-D grid is, and what the counting barriers return.
extern "C" __global__ void where(int* linear, int* counts) {
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int threads = blockDim.x * blockDim.y * blockDim.z;
    linear[b * threads + t] = 1000 * b + t;
    const int odd = __syncthreads_count(t % 2);
    const int all = __syncthreads_and(t < threads);
    const int any = __syncthreads_or(t == 5);
    __syncwarp();
    if (t == 0) { counts[3 * b] = odd; counts[3 * b + 1] = all; counts[3 * b + 2] = any; }
}

// Static shared memory in a template, read before it is written (poison), and two extern arrays (one address).
template <int N>
__global__ void shared_forms(float* out, unsigned* same) {
    __shared__ float early[N];
    extern __shared__ __align__(16) unsigned char raw[];
    extern __shared__ float as_float[];
    out[threadIdx.x] = early[threadIdx.x];
    if (threadIdx.x == 0) same[0] = (void*)raw == (void*)as_float;
    __syncthreads();
    early[threadIdx.x] = 1.0f;
}
"""


def test_builtins_in_three_dimensions():
    kernel = CpuModule(BUILTINS, source_name="builtins.cu").get_function("where")
    grid, block = (2, 3, 2), (4, 3, 2)                        # 12 blocks of 24 threads
    linear, counts = np.full(12 * 24, -1, np.int32), np.zeros(36, np.int32)
    kernel(grid, block, (linear, counts))
    np.testing.assert_array_equal(linear, (1000 * np.arange(12)[:, None] + np.arange(24)).ravel())
    np.testing.assert_array_equal(counts.reshape(12, 3), np.tile([12, 1, 1], (12, 1)))


def test_static_shared_of_a_template_is_counted_and_poisoned():
    module = CpuModule(BUILTINS, name_expressions=["shared_forms<40>"], source_name="builtins.cu")
    kernel = module.get_function("shared_forms<40>")
    assert kernel.shared_size_bytes == 40 * 4
    out, same = np.zeros(40, np.float32), np.zeros(1, np.uint32)
    for _ in range(2):                                         # the second launch must see poison again, not 1.0
        kernel((1,), (40,), (out, same), shared_mem=64)
        assert np.isnan(out).all() and same[0] == 1


ORDER_PROBE = r"""
// The ticket each thread draws in two rounds, before and after a barrier: the order the runner resumed them in.
extern "C" __global__ void tickets(int* counter, int* ticket) {
    ticket[threadIdx.x] = atomicAdd(counter, 1);
    __syncthreads();
    ticket[blockDim.x + threadIdx.x] = atomicAdd(counter, 1) - int(blockDim.x);
}
"""


@pytest.mark.parametrize("mode", MODES)
def test_resume_orders(mode):
    module = CpuModule(ORDER_PROBE, mode=mode, source_name="order.cu")

    def tickets(order: str, seed: int = 0) -> np.ndarray:
        kernel = module.get_function("tickets")
        kernel.order, kernel.seed = order, seed
        counter, ticket = np.zeros(1, np.int32), np.full(2 * 48, -1, np.int32)
        kernel((1,), (48,), (counter, ticket))
        return ticket.reshape(2, 48)                       # (round, thread): each thread's place in the round

    np.testing.assert_array_equal(tickets("forward"), np.tile(np.arange(48), (2, 1)))
    np.testing.assert_array_equal(tickets("reverse"), np.tile(np.arange(48)[::-1], (2, 1)))
    shuffled = tickets("shuffle", 7)
    assert all(sorted(row) == list(range(48)) for row in shuffled)               # each round: a permutation
    assert (shuffled[0] != shuffled[1]).any() and (shuffled != np.arange(48)).any()   # drawn afresh per round
    np.testing.assert_array_equal(tickets("shuffle", 7), shuffled)              # a seed replays its schedule
    assert (tickets("shuffle", 8) != shuffled).any()
    assert module.order == DEFAULT_ORDER == "shuffle"


def test_unknown_order_or_bad_seed_is_refused():
    with pytest.raises(KernelError, match="order must be one of forward, reverse, shuffle"):
        CpuModule(ORDER_PROBE, order="random")
    with pytest.raises(KernelError, match="seed must be an int"):
        CpuModule(ORDER_PROBE, seed=-1)
    kernel = CpuModule(ORDER_PROBE, source_name="order.cu").get_function("tickets")
    kernel.order = "backwards"
    with pytest.raises(KernelError, match="tickets: order must be one of"):
        kernel((1,), (4,), (np.zeros(1, np.int32), np.zeros(8, np.int32)))


def test_unknown_kernel_name_is_a_clear_error(reduce_module):
    with pytest.raises(KernelError, match="reduce.cu has no kernel 'block_max'"):
        reduce_module.get_function("block_max")


def test_overheads_are_measured():
    costs = measure_overheads("fibers", threads=64, repeats=20)
    assert set(costs) == {"block_ms", "barrier_ms", "shuffle_ms"} and costs["block_ms"] > 0
    assert all(np.isfinite(v) for v in costs.values())        # timings: printed by the module, never asserted


# ---- half and bfloat16 storage -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def half_module():
    return CpuModule(HALF, source_name="half.cu")


def test_half_to_float_for_all_65536_bit_patterns(half_module):
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    out = np.zeros(65536, np.float32)
    half_module.get_function("half_to_float")((256,), (256,), (bits.view(np.float16), out, np.int32(65536)))
    expected = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(expected)
    assert (np.isnan(out) == nan).all()
    np.testing.assert_array_equal(out[~nan].view(np.uint32), expected[~nan].view(np.uint32))   # -0.0 too


def test_float_to_half_rounds_like_numpy(half_module):
    rng = np.random.default_rng(5)
    around_half = rng.integers(0x33000000, 0x47800000, 40000, dtype=np.uint32)   # subnormal .. overflow, in bits
    ties = (np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
            .view(np.uint32)[:0x7c00] + 0x1000)          # exact halfway points between neighbouring normal halves
    special = np.array([0.0, -0.0, 65504.0, 65519.99, 65520.0, 1e9, -1e9, 2.0**-24, 2.0**-25, 2.0**-25 * 1.0001,
                        5.96e-8, np.inf, -np.inf, np.nan], np.float32)
    x = np.concatenate([around_half.view(np.float32), -around_half.view(np.float32), ties.view(np.float32), special])
    out = np.zeros(x.size, np.float16)
    half_module.get_function("float_to_half")(((x.size + 255) // 256,), (256,), (x, out, np.int32(x.size)))
    with np.errstate(over="ignore"):                      # overflow to infinity is part of what is tested
        expected = x.astype(np.float16)
    nan = np.isnan(expected)
    assert (np.isnan(out) == nan).all()
    np.testing.assert_array_equal(out[~nan].view(np.uint16), expected[~nan].view(np.uint16))


def test_bfloat16_rounds_like_torch(half_module):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.integers(0, 2**32, 50000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                        np.array([0.0, -0.0, 1.00390625, 1.01171875, 3.4e38, np.inf, -np.inf], np.float32)])
    x = x[~np.isnan(x)]
    bits, back = np.zeros(x.size, np.uint16), np.zeros(x.size, np.float32)
    half_module.get_function("bf16_round_trip")(((x.size + 255) // 256,), (256,), (x, bits, back, np.int32(x.size)))
    expected = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(bits, expected)
    np.testing.assert_array_equal(back, torch.from_numpy(x).to(torch.bfloat16).float().numpy())


# ---- planted bugs ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", MODES)
def test_missing_syncthreads_gives_nan_not_the_right_answer(mode, order):
    module = planted("missing_syncthreads.cu", mode, order)
    x = np.arange(256, dtype=np.float32)
    expected = np.roll(x.reshape(2, 128), -1, axis=1).ravel()
    fixed = np.zeros_like(x)
    module.get_function("rotate_left_fixed")((2,), (128,), (x, fixed))
    np.testing.assert_array_equal(fixed, expected)
    buggy = np.zeros_like(x)
    module.get_function("rotate_left")((2,), (128,), (x, buggy))
    assert np.isnan(buggy).any()


@pytest.mark.parametrize("mode", MODES)
def test_write_after_read_is_wrong_except_in_forward_order(mode):
    """The runner is no race detector: a missing barrier shows only in an order that runs a writer too early."""
    x = np.arange(256, dtype=np.float32)
    expected = np.concatenate([x[2:128], [0, 0], x[130:], [0, 0]])      # (2 blocks * 128,): shifted left twice
    results = {}
    for order in ORDERS:
        out = np.zeros_like(x)
        planted("missing_syncthreads.cu", mode, order).get_function("shift_left_twice")((2,), (128,), (x, out))
        results[order] = out
    np.testing.assert_array_equal(results["forward"], expected)       # every read ran before the write it needed
    assert (results["reverse"] != expected).any() and (results["shuffle"] != expected).any()
    assert np.isfinite(results["reverse"]).all()                      # stale data, not poison: wrong, not NaN


@pytest.mark.parametrize("mode", MODES)
def test_divergent_barrier_names_file_and_line(mode):
    module = planted("divergent_barrier.cu", mode)
    data = np.arange(64, dtype=np.float32)
    with pytest.raises(KernelError, match="divergent __syncthreads") as caught:
        module.get_function("two_barriers")((1,), (64,), (data,))
    message = str(caught.value)
    assert f"divergent_barrier.cu:{line_of('divergent_barrier.cu', 'even threads wait here')}" in message
    assert f"divergent_barrier.cu:{line_of('divergent_barrier.cu', 'odd threads wait here')}" in message
    assert isinstance(caught.value, MiniTransformerError)


def test_threads_returning_before_a_barrier_are_reported():
    module = planted("divergent_barrier.cu")
    x, out = np.ones(128, np.float32), np.zeros(128, np.float32)
    module.get_function("early_return")((2,), (64,), (x, out, np.int32(128)))   # n covers every thread: fine
    with pytest.raises(KernelError, match="already returned") as caught:
        module.get_function("early_return")((2,), (64,), (x, out, np.int32(100)))
    line = line_of("divergent_barrier.cu", "the barrier the returned threads skip")
    assert f"divergent_barrier.cu:{line}: __syncthreads in block (1,0,0)" in str(caught.value)


@pytest.mark.parametrize("mode", MODES)
def test_shuffle_not_reached_by_every_lane_is_reported(mode):
    module = planted("divergent_barrier.cu", mode)
    with pytest.raises(KernelError, match="not reached by lane 16") as caught:
        module.get_function("half_warp_shuffle")((1,), (32,), (np.zeros(32, np.float32),))
    assert f"divergent_barrier.cu:{line_of('divergent_barrier.cu', 'lanes 16-31 of the mask')}" in str(caught.value)


@pytest.mark.parametrize("mode", MODES)
def test_shuffle_reading_a_lane_that_returned_is_reported(mode):
    module = planted("exited_lanes.cu", mode)
    x, out = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    module.get_function("sum_after_return")((2,), (32,), (x, out, np.int32(64)))     # every lane takes part: fine
    np.testing.assert_array_equal(out, np.repeat(x.reshape(2, 32).sum(1), 32))
    with pytest.raises(KernelError) as caught:                      # block 1: lanes 20-31 (i >= 52) have returned
        module.get_function("sum_after_return")((2,), (32,), (x, out, np.int32(52)))
    line = line_of("exited_lanes.cu", "reads lanes that have returned")
    assert (f"exited_lanes.cu:{line}: __shfl_xor_sync (mask 0xffffffff) in block (1,0,0): lane 4, thread (4,0,0), "
            "reads lane 20, thread (20,0,0), which has already returned") in str(caught.value)


@pytest.mark.parametrize("mode", MODES)
def test_a_mask_naming_returned_lanes_is_fine_when_nobody_reads_them(mode):
    """CUDA waits only for the lanes of the mask that have not exited: a broadcast and a ballot stay defined."""
    module = planted("exited_lanes.cu", mode)
    x, out, ballot = np.arange(64, dtype=np.float32), np.full(64, -1, np.float32), np.zeros(2, np.uint32)
    module.get_function("broadcast_after_return")((2,), (32,), (x, out, ballot, np.int32(52)))
    np.testing.assert_array_equal(out, np.concatenate([np.full(32, 0.0), np.full(20, 32.0), np.full(12, -1.0)]))
    np.testing.assert_array_equal(ballot, [0xFFFFFFFF, (1 << 20) - 1])


def test_the_module_still_runs_after_a_failed_launch():
    module = planted("divergent_barrier.cu", "threads")
    with pytest.raises(KernelError):
        module.get_function("two_barriers")((1,), (64,), (np.zeros(64, np.float32),))
    x, out = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    module.get_function("early_return")((1,), (64,), (x, out, np.int32(64)))
    np.testing.assert_array_equal(out, np.roll(x, -1))


def test_shared_memory_limits():
    with pytest.raises(KernelError, match="65536 bytes of static"):
        planted("shared_too_big.cu").get_function("too_big")((1,), (32,), (np.zeros(32, np.float32),))
    module = CpuModule(REDUCE, name_expressions=["scale_rows<float, 3>"], source_name="reduce.cu")
    kernel = module.get_function("scale_rows<float, 3>")
    cols = 20000                                                  # 80,000 bytes of dynamic shared memory
    x, out = np.ones((1, cols), np.float32), np.zeros((1, cols), np.float32)
    with pytest.raises(KernelError, match="exceed the limit"):
        kernel((1,), (128,), (x, out, np.int32(cols)), shared_mem=cols * 4)
    kernel.max_dynamic_shared_size_bytes = cols * 4               # opt in, as on the GPU
    kernel((1,), (128,), (x, out, np.int32(cols)), shared_mem=cols * 4)
    assert (out == 3).all()


def test_memory_faults_raise_instead_of_killing_python():
    module = planted("memory_faults.cu", order="forward")        # thread 0 runs first: it overflows first
    out = np.zeros(32, np.int32)
    with pytest.raises(KernelError, match=r"stack overflow in thread \(0,0,0\) of block \(0,0,0\)"):
        module.get_function("recurse")((1,), (32,), (out, np.int32(2000)))        # ~2 MB of locals, 256 KiB stack
    with pytest.raises(KernelError, match=r"illegal memory access at \S+ in thread \(3,0,0\)"):
        module.get_function("write_far")((1,), (32,), (np.zeros(8, np.float32), np.int64(1 << 42)))
    lengths = np.zeros(32, np.int32)
    lengths[7] = 100
    with pytest.raises(KernelError, match=rf"memory_faults.cu:{line_of('memory_faults.cu', 'the trap')}: __trap\(\) "
                                          r"in thread \(7,0,0\)"):
        module.get_function("checked")((1,), (32,), (lengths, np.int32(99)))
    kernel = module.get_function("recurse")
    kernel((1,), (32,), (out, np.int32(10)))                                   # the process and module live on
    assert (out == sum(range(11))).all()
    kernel.stack_size = 4 * 1024 * 1024                                        # a bigger stack fits the recursion
    kernel((1,), (2,), (out, np.int32(2000)))
    assert out[0] == sum(n % 256 - 256 * (n % 256 > 127) for n in range(1, 2001))   # char(n) wraps


# ---- arguments: the mistakes CuPy would not catch --------------------------------------------------------------------

def test_arguments_are_checked_against_the_kernel_signature(reduce_module):
    kernel = reduce_module.get_function("block_sum")
    x, out = np.ones(64, np.float32), np.zeros(1, np.float32)
    with pytest.raises(KernelError, match="argument 2 .* Python int: pass a NumPy scalar"):
        kernel((1,), (64,), (x, out, 64))
    with pytest.raises(KernelError, match="argument 2 .*float64 scalar"):
        kernel((1,), (64,), (x, out, np.float64(64)))
    with pytest.raises(KernelError, match="argument 2 .*int64 scalar"):
        kernel((1,), (64,), (x, out, np.int64(64)))
    with pytest.raises(KernelError, match="not C-contiguous"):
        kernel((1,), (64,), (np.ones(128, np.float32)[::2], out, np.int32(64)))
    with pytest.raises(KernelError, match="array of float64"):
        kernel((1,), (64,), (x.astype(np.float64), out, np.int32(64)))
    with pytest.raises(KernelError, match="read-only"):
        kernel((1,), (64,), (x, np.broadcast_to(out, (1,)), np.int32(64)))
    with pytest.raises(KernelError, match="takes 3 arguments, got 2"):
        kernel((1,), (64,), (x, out))
    with pytest.raises(KernelError, match="1024 per block"):
        kernel((1,), (2048,), (x, out, np.int32(64)))
    kernel((1,), (64,), (np.broadcast_to(x, (64,)), out, np.uint32(64)))    # read-only into const float*: fine
    assert out[0] == 64


def test_compile_errors_point_at_the_cu_file_and_line():
    source = "extern \"C\" __global__ void broken(float* x) {\n    x[0] = 1.0f\n}\n"
    with pytest.raises(KernelError, match=r"broken\.cu:[23]:"):
        CpuModule(source, source_name="broken.cu")


def test_compiled_library_is_cached():
    first = CpuModule(WARP, source_name="warp.cu")
    built = first.library_path.stat().st_mtime_ns
    again = CpuModule(WARP, source_name="warp.cu")
    assert again.library_path == first.library_path                # same source: same key
    assert again.library_path.stat().st_mtime_ns == built           # and no recompile


def test_options_are_limited_to_defines_and_include_dirs():
    with pytest.raises(KernelError, match="only -D and -I"):
        CpuModule(REDUCE, options=["-O0"])
    source = ('// extern "C" __global__ void retired(int* x) {} -- a kernel in a comment is not compiled\n'
              'extern "C" __global__ void k(int* x) { x[threadIdx.x] = VALUE; }\n')
    module = CpuModule(source, options=["-DVALUE=7"])
    x = np.zeros(4, np.int32)
    module.get_function("k")((1,), (4,), (x,))
    assert (x == 7).all()

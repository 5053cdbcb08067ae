"""What one forward pass asks of a machine, and the roofline that bounds it: FLOPs, bytes and published peaks.

A step of the model is limited either by arithmetic (FLOP/s) or by moving bytes through memory (bytes/s). Which one
depends on its arithmetic intensity, FLOPs per byte moved: a prefill of P tokens multiplies every weight by P rows
(intensity grows with P), a decode step multiplies every weight by one row (intensity ~ 0.5 FLOP/byte in float32).
The machine's ridge point, peak FLOP/s / peak bytes/s, separates the two regimes (Williams, Waterman and Patterson,
"Roofline: an insightful visual performance model", CACM 2009).

    forward_cost            FLOPs and bytes of one forward pass (prefill: new_tokens = P; decode: 1 at context S),
                            layer_cost.py's products of one layer added up over the pass
    roofline_tokens_per_s   the decode upper bound: read bandwidth / bytes read per token
    measure_matmul_rows     one weight matrix times T rows, for small T: what a batch or a verify pass costs here
                            (time_matmul_rows gives the Timing behind each)
    H200, NVLINK4, ...      a GPU's peaks and links from their datasheets, for the same arithmetic on machines we lack

This machine's own peaks (read and copy bandwidth, GEMM FLOP/s) are measured in peaks.py, once per set of runs.
Lesson 02_prefill_vs_decode, scripts/bench_loop.py and the roofline figure use these; lessons 02, 07, 08, 12, 13 and
17 put the H200's numbers next to this machine's measured ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..core.config import ModelConfig
from ..core.kv_cache import kv_bytes_per_token
from ..core.model import layer_parameters
from .layer_cost import layer_products
from .measure import Timing, interleaved
from .peaks import sync_for


def time_matmul_rows(xp, w, rows, repeats: int = 20) -> dict[int, Timing]:
    """The Timing of x (T, D) @ w (D, O) for each T in rows, timed in turns (measure.interleaved): the same weights
    read, T times the arithmetic.

    Were the product bound by reading w, T = 4 would cost what T = 1 costs; on a CPU it costs more, because BLAS
    multiplies one row with a matrix-vector routine and several with a matrix-matrix one built for large blocks.
    In turns, a busy moment of the machine slows every T alike instead of one of them.
    """
    inputs = {T: xp.ones((T, w.shape[0]), dtype=w.dtype) for T in rows}             # (T, D) each

    def product(x) -> Callable[[], object]:
        return lambda: x @ w

    runs = {T: product(x) for T, x in inputs.items()}
    return interleaved(runs, repeats, sync=sync_for(xp))


def measure_matmul_rows(xp, w, rows, repeats: int = 20) -> dict[int, float]:
    """Seconds of the fastest x (T, D) @ w (D, O) for each T in rows (time_matmul_rows has the medians and spreads).
    """
    return {T: timing.min for T, timing in time_matmul_rows(xp, w, rows, repeats).items()}


@dataclass
class PhaseCost:
    """Work of one forward pass: FLOPs done and bytes moved through memory."""
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte: above the machine's ridge point a phase is compute-bound, below it memory-bound."""
        return self.flops / self.bytes


def forward_cost(config: ModelConfig, new_tokens: int, context_tokens: int = 0, batch: int = 1,
                 weight_bytes: float | None = None, dtype_bytes: int = 4) -> PhaseCost:
    """FLOPs and bytes of one forward of `new_tokens` tokens per sequence after `context_tokens` cached ones.

    Prefill of P tokens: forward_cost(cfg, P). A decode step at context S: forward_cost(cfg, 1, S).
    The layers' share is layer_cost.layer_products, the one cost model, times n_layers; the pass adds the lm_head
    and the cache writes (the engine's forward with last_only=True, as prefill.py and decode.py call it):
    - FLOPs: 2 per weight per token for the layer matmuls (N = batch * new_tokens rows), 2 * D * V per sequence for
      the lm_head (only the last position's logits are computed), and attention's two matmuls, q k^T and probs v,
      4 * H * d per (query, key) pair that layers.causal_attention computes (layers.causal_pairs): every pair for
      up to 64 new tokens (the future ones masked), and for a longer prompt each block of 64 queries against only
      the keys it can see, about half of all new_tokens x (context + new) pairs.
      Norms, RoPE, softmax and SiLU are elementwise and left out (under 1% of the FLOPs here).
    - bytes: every weight read once (`weight_bytes` if given, e.g. Transformer.weight_bytes; otherwise the layer
      weights of model.LAYER_WEIGHTS, the final norm and lm_head at dtype_bytes each), the KV cache read (all
      context + new keys and values, every layer) and written (the new ones), and activations: each weight
      matmul's input read and output written, and the attention scores (B, H, T, S) written and read back once.
      Caches between DRAM and the ALUs are ignored, so these are the bytes of an implementation that keeps nothing
      on chip between operations, q read by q k^T and the attention output written by probs v included (a bound
      that left real traffic out would be a wrong bound; lessons 02 and 07 print these totals as they are).
    """
    c = config
    products = layer_products(c, new_tokens, context_tokens, batch, dtype_bytes)   # one layer's, whole batch
    layer_flops = sum(p.flops for p in products)
    layer_traffic = sum(p.bytes - p.weight_bytes for p in products)     # activations and the cache read

    if weight_bytes is None:
        weight_bytes = (c.n_layers * layer_parameters(c) + c.d_model * c.vocab_size + c.d_model) * dtype_bytes
    kv_written = batch * new_tokens * kv_bytes_per_token(c, dtype=f"f{dtype_bytes}")   # K and V, every layer
    logits_io = batch * (c.d_model + c.vocab_size) * dtype_bytes        # the last rows in, their logits out
    return PhaseCost(flops=float(c.n_layers * layer_flops + 2 * c.d_model * c.vocab_size * batch),
                     bytes=float(weight_bytes + c.n_layers * layer_traffic + kv_written + logits_io))


def roofline_tokens_per_s(weight_bytes: float, bandwidth: float) -> float:
    """Upper bound on batch-1 decode tokens/s: every step must stream all weights from memory at least once, so
    tokens/s <= bandwidth / bytes per token. Pass weights + cache bytes to include the cache read."""
    return bandwidth / weight_bytes


@dataclass(frozen=True)
class PublishedPeaks:
    """Two peaks read from a maker's datasheet, not measured: the roofline of a machine the lessons cannot run on.

    seconds() is a lower bound (no kernel launches, no overlap losses), which is what a roofline promises; real
    steps of a model this small sit well above it, because each of its many small kernels has a fixed launch cost.
    """
    name: str
    bandwidth: float           # bytes/s of main memory (HBM)
    flops: float               # dense FLOP/s of the matrix units at `dtype`
    dtype: str
    dtype_bytes: int           # bytes per weight, cached key/value and activation at that dtype

    @property
    def ridge(self) -> float:
        """FLOP per byte above which a pass waits on arithmetic rather than on memory."""
        return self.flops / self.bandwidth

    def cost(self, config: ModelConfig, new_tokens: int, context_tokens: int = 0, batch: int = 1) -> PhaseCost:
        """forward_cost with every array at this machine's dtype (bf16 weights read, not float32)."""
        return forward_cost(config, new_tokens, context_tokens, batch, dtype_bytes=self.dtype_bytes)

    def seconds(self, cost: PhaseCost) -> float:
        """Roofline time of one pass: the longer of its arithmetic at peak and its bytes at full bandwidth."""
        return max(cost.flops / self.flops, cost.bytes / self.bandwidth)


# NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (https://www.nvidia.com/en-us/data-center/h200/):
# GPU memory bandwidth 4.8 TB/s (141 GB HBM3e); BF16 Tensor Core 1,979 TFLOPS *with sparsity*, so ~990 dense.
H200 = PublishedPeaks("H200 SXM (datasheet)", bandwidth=4.8e12, flops=989e12, dtype="bf16", dtype_bytes=2)


# ------------------------------------------------------------------------------------------------ links between GPUs

@dataclass(frozen=True)
class PublishedLink:
    """A GPU-to-GPU link from published figures, and what a ring all-reduce over n GPUs costs on it (lesson 15).

    A ring all-reduce of B bytes over n GPUs sends 2(n - 1) chunks of B/n bytes through each GPU's link, one after
    another (n - 1 steps of reduce-scatter, then n - 1 of all-gather):

        seconds = base latency + 2(n - 1) x hop latency + 2(n - 1)/n x B / bandwidth

    The latency terms are NCCL's own cost model (NVIDIA/nccl, src/graph/tuning.cc: `baseLat` and `hwLat`, ring
    algorithm, LL protocol, the one NCCL picks for small messages); the bandwidth is one direction of the link.
    Like PublishedPeaks, this is a model from the maker's figures, not a measurement: it is what an interview answer
    can compute on a whiteboard, and it ignores overlap of the collectives with compute.
    """
    name: str
    bandwidth: float           # bytes/s per GPU, one direction
    base_latency: float        # s, once per all-reduce
    hop_latency: float         # s, per ring step

    def transfer_seconds(self, nbytes: float) -> float:
        """One point-to-point send of nbytes (a prompt's KV cache from a prefill GPU to a decode GPU, lesson 16)."""
        return self.base_latency + nbytes / self.bandwidth

    def all_reduce_seconds(self, nbytes: float, n: int) -> float:
        if n == 1:
            return 0.0
        steps = 2 * (n - 1)
        return self.base_latency + steps * self.hop_latency + steps / n * nbytes / self.bandwidth


# NVLink 4 (H100 and H200 SXM): 900 GB/s of bidirectional bandwidth per GPU (NVIDIA H100 / H200 datasheets), so 450
# GB/s each way. NCCL's tuning.cc: ring LL base latency 6.6 us, 0.6 us per NVLink hop, 1.0 us per PCIe hop.
NVLINK4 = PublishedLink("NVLink 4 (H100/H200 SXM)", bandwidth=450e9, base_latency=6.6e-6, hop_latency=0.6e-6)
# PCIe 5.0 x16: 32 GT/s x 16 lanes, ~64 GB/s each way (PCI-SIG): the link of a GPU without NVLink.
PCIE5 = PublishedLink("PCIe 5.0 x16", bandwidth=64e9, base_latency=6.6e-6, hop_latency=1.0e-6)
# RDMA between machines: one InfiniBand NDR port, 400 Gb/s = 50 GB/s each way (NVIDIA ConnectX-7 / Quantum-2 NDR),
# a DGX H100/H200's per-GPU network link. Its latency is microseconds; the latencies here are NCCL's NET-hop order
# of magnitude, which a transfer of megabytes never notices.
IB_NDR = PublishedLink("InfiniBand NDR 400 Gb/s (RDMA)", bandwidth=50e9, base_latency=6.6e-6, hop_latency=5e-6)


@dataclass(frozen=True)
class SplitStep:
    """One forward of `tokens` tokens split over n GPUs: each GPU's share of the compute, and the all-reduces."""
    n: int
    tokens: int
    compute: float             # s: the one-GPU roofline time / n (each GPU reads 1/n of the weights, does 1/n of
                               # the FLOPs; the replicated embedding and lm_head are counted as split, a lower bound)
    all_reduces: int           # 2 per layer
    all_reduce_bytes: float    # each: tokens x d_model x dtype_bytes
    communication: float       # s: all_reduces x PublishedLink.all_reduce_seconds

    @property
    def seconds(self) -> float:
        return self.compute + self.communication


def split_step(peaks: PublishedPeaks, link: PublishedLink, config: ModelConfig, tokens: int, n: int) -> SplitStep:
    """Tensor parallelism's arithmetic for one forward (Megatron: two all-reduces of the hidden state per layer),
    with no overlap of compute and communication: the longest a step can take at the roofline."""
    nbytes = tokens * config.d_model * peaks.dtype_bytes
    reduces = 2 * config.n_layers if n > 1 else 0
    return SplitStep(n, tokens, peaks.seconds(peaks.cost(config, tokens)) / n, reduces, nbytes,
                     reduces * link.all_reduce_seconds(nbytes, n))

"""CUDA attention kernels: plain .cu sources, built by CuPy on a GPU or by the CPU runner without one (lesson 11).

    flash_prefill(q, k, v)                                      causal GQA over a chunk of queries (online softmax)
    flash_prefill(q, k, v, variant="wmma")                      the same on tensor cores (float16, CUDA's wmma)
    paged_decode(q, k_cache, v_cache, block_tables, seq_lens)   one query per sequence, paged cache, split-K
    paged_decode(..., variant="simple")                         the teaching baseline (paged_decode_simple.cu)

NumPy inputs run the very same source on the CPU (kernels/cpu_runner.py); CuPy inputs run on the GPU.
`python -m minitransformer.kernels.compile_check` compiles every instantiation for sm_90 with nvcc;
`python -m minitransformer.kernels.sass_report` reads their SASS and estimates, old decode kernel
(paged_decode_simple.cu) vs new (paged_decode.cu), the HBM bandwidth each can reach on an H200.
"""

from .attention import flash_prefill, paged_decode

__all__ = ["flash_prefill", "paged_decode"]

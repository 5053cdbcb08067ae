"""Benchmarks: this machine's peaks (bandwidth, GEMM), a forward pass's cost model, and `minitransformer bench`
(workloads.py: our measurements; peers.py: HF and llama.cpp; run.py: the alternating runs, `run_bench`;
report.py: outputs).

Only the cost model is imported here. Importing any bench module runs this file first, and run.py reaches up to the
figures (viz_measure) for the machine's label: imported here, it would close an import circle through every module
that uses the cost model (tests/test_layering.py models package imports and checks there is none).
"""

from ..lab.machine import PhaseCost, forward_cost, measure_copy_bandwidth, measure_gemm_flops, roofline_tokens_per_s

__all__ = ["PhaseCost", "forward_cost", "measure_copy_bandwidth", "measure_gemm_flops", "roofline_tokens_per_s"]

"""Benchmarks: this machine's peaks (bandwidth, GEMM), a forward pass's cost model, and `minitransformer bench`
(workloads.py: our measurements; peers.py: HF and llama.cpp; run.py: the alternating runs; report.py: outputs)."""

from .machine import PhaseCost, forward_cost, measure_copy_bandwidth, measure_gemm_flops, roofline_tokens_per_s
from .run import DEFAULT, QUICK, Settings, run_bench

__all__ = ["PhaseCost", "forward_cost", "measure_copy_bandwidth", "measure_gemm_flops", "roofline_tokens_per_s",
           "DEFAULT", "QUICK", "Settings", "run_bench"]

"""Benchmarks' shared measurements: this machine's peaks (bandwidth, GEMM) and a forward pass's cost model."""

from .machine import PhaseCost, forward_cost, measure_copy_bandwidth, measure_gemm_flops, roofline_tokens_per_s

__all__ = ["PhaseCost", "forward_cost", "measure_copy_bandwidth", "measure_gemm_flops", "roofline_tokens_per_s"]

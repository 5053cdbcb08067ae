"""Benchmarks and peers: `minitransformer bench` (workloads.py: our measurements; peers.py: HF and llama.cpp;
run.py: the alternating runs, `run_bench`; report.py: outputs), `bench serve` against any OpenAI-compatible server
(serve.py, serve_workload.py, serve_report.py; serve_compare.py starts our server beside llama-server and vLLM),
`bench engine` (engine_bound.py), and the workloads of lessons 16 and 17 (interference.py, router_workload.py,
model_shape.py).

Every timing goes through lab/measure.py, and the machine's own figures (bandwidth, GEMM peak, the cost model) are
lab/machine.py's: bench/ builds on lab/, never the other way round.
"""

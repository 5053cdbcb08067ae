"""A static report of the compiled kernels, and the decode bandwidth an H200 could reach with them (lesson 11).

    python -m minitransformer.kernels.sass_report [--latency-ns 800] [--sms 132]

No GPU needed: nvcc compiles each kernel file for sm_90 as compile_check.py does, cuobjdump lists the SASS, and per
kernel the report prints registers, shared memory and spills (ptxas), and for its busiest loop the global loads per
iteration, their width, and how many a warp issues before the first instruction that uses one (sass_loops.py).

Then Little's law, for paged decode old (paged_decode_simple.cu) and new (paged_decode.cu) side by side: a warp with
L bytes requested and not yet arrived, W such warps resident on each of S busy SMs, and a memory latency t give at
most S x W x L / t bytes per second, and never more than the HBM's 4.8 TB/s. W comes from the grid (partitions x K x
B blocks, decode_sizing.py) and the occupancy the registers and shared memory allow; L from the SASS of the key loop
and of the value loop (each streams half the bytes). Each loop is also held to what its instruction count lets the
SMs issue (issue_bound). Assumptions, all on the optimistic side except the latency: all
lanes load, warps spend their time waiting on the loop's loads (not in the softmax between the loops), the grid runs
in full waves; the partial results the merge reads back are added at full bandwidth. It is an estimate to compare
designs, not a measurement (scripts/gpu_check_kernels.py measures).
Exit code 1 when the new kernel misses its targets (>= 4 loads in flight per warp before the first use in
both loops; >= 75% of HBM at batch >= 8 and 4k / 32k context), 2 when nvcc or cuobjdump is missing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .compile_check import DEFAULT_ARCH, KERNEL_FILES, demangle, instantiation_source, nvcc_command, parse_ptxas
from .decode_sizing import (
    DECODE_VARIANTS,
    DEFAULT_NUM_SMS,
    PARTITION_KERNELS,
    choose_partition_size,
    decode_expressions,
    decode_shared_bytes,
    decode_threads,
)
from .sass_loops import Loop, find_loops, innermost_busiest, parse_sass, split_functions
from .toolchain import cuda_roots, find_nvcc, nvidia_wheel_dirs

# H200 SXM: 4.8 TB/s of HBM3e (NVIDIA H200 Tensor Core GPU datasheet), 132 SMs. Per SM on compute capability 9.0
# (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability"): 64K 32-bit registers, allocated
# per warp in units of 256; 228 KB of shared memory, of which the system reserves 1 KB per block; 2048 threads; 32
# blocks.
HBM_BYTES_PER_S = 4.8e12
REGISTERS_PER_SM, REGISTER_UNIT = 65536, 256
SHARED_PER_SM, SHARED_RESERVED = 228 * 1024, 1024
THREADS_PER_SM, BLOCKS_PER_SM = 2048, 32
# Latency of a load that misses the caches, under load. Pointer-chasing microbenchmarks measure an idle Hopper's
# global memory latency at a few hundred core cycles (around 400 in the comparison table of PMC10448217, "Hardware
# features of different Nvidia GPU architectures"; about 230 ns at 1.755 GHz); at full bandwidth requests queue,
# so we assume 800 ns, well above that: an estimate over 75% must not rest on a short latency.
LATENCY_NS = 800.0
# Instruction issue: each SM has 4 warp schedulers issuing one warp-instruction per cycle each (NVIDIA Hopper
# architecture whitepaper), at 1.98 GHz, the GH100 chip's maximum boost clock (H100 SXM5 specifications; the H200 is
# the same chip with HBM3e); a loop that needs n instructions per b bytes cannot stream faster than
# SMs x 4 x clock x b / n, however many loads are in flight.
ISSUE_PER_SM_PER_S = 4 * 1.98e9
WARP = 32

MODELS = {"SmolLM2-135M (H9/K3, d64)": (9, 3, 64), "Llama-3-8B shape (H32/K8, d128)": (32, 8, 128)}
DTYPES = {"float16": ("__half", 2), "float32": ("float", 4)}
BATCHES, CONTEXTS, BLOCK_SIZE = (1, 8, 64), (4096, 32768), 16
TARGET_LOADS, TARGET_FRACTION, TARGET_BATCH = 4, 0.75, 8


@dataclass
class KernelSass:
    """What ptxas and the SASS say about one kernel instantiation."""
    file: str
    name: str
    registers: int
    spill_bytes: int
    static_smem: int
    loops: list[Loop]

    def streaming_loops(self) -> tuple[Loop | None, Loop | None]:
        """(key loop, value loop) of a decode partition kernel: the busiest loop with a warp reduction, then the
        busiest one after it; for other kernels (busiest loop, None)."""
        first = innermost_busiest([loop for loop in self.loops if loop.has_shuffle]) or innermost_busiest(self.loops)
        if first is None or "partition" not in self.name:
            return first, None
        return first, innermost_busiest([loop for loop in self.loops if loop.start > first.end])


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, in the CUDA toolkit, or from NVIDIA's pip wheel (nvidia-cuda-cuobjdump)."""
    candidates = [shutil.which("cuobjdump")] + [str(r / "bin" / "cuobjdump") for r in cuda_roots()]
    candidates += [str(p) for base in nvidia_wheel_dirs() for p in base.glob("*/bin/cuobjdump")]
    return next((c for c in candidates if c and Path(c).is_file()), None)


def compile_sass(filename: str, expressions: tuple[str, ...], arch: str, nvcc: str, cuobjdump: str,
                 max_group: int | None = None) -> list[KernelSass]:
    """Compile one kernel file with nvcc (CuPy's options), read ptxas's report and the SASS of each instantiation.

    `max_group`: compile with DECODE_MAX_GROUP = max_group, so the loops hold exactly the head branches that a
    configuration with G = max_group runs (the shipped build also holds the ones it skips).
    """
    text = instantiation_source(filename, expressions)
    if max_group is not None:
        text = re.sub(r"constexpr int DECODE_MAX_GROUP = \d+;", f"constexpr int DECODE_MAX_GROUP = {max_group};", text)
    with tempfile.TemporaryDirectory(prefix="mt_sass_report_") as tmp:
        source = Path(tmp) / filename
        source.write_text(text)
        built = subprocess.run(nvcc_command(nvcc, source, arch), capture_output=True, text=True, cwd=tmp)
        if built.returncode != 0:
            raise RuntimeError(f"nvcc failed on {filename}:\n{built.stderr.strip()}")
        # cuobjdump runs nvdisasm, which NVIDIA's wheels put next to it
        env = dict(os.environ, PATH=str(Path(cuobjdump).parent) + os.pathsep + os.environ.get("PATH", ""))
        listing = subprocess.run([cuobjdump, "-sass", str(source.with_suffix(".cubin"))], capture_output=True,
                                 text=True, env=env, check=True).stdout
    stats = parse_ptxas(built.stdout + built.stderr)
    functions = split_functions(listing)
    readable = demangle(list(functions))
    by_name = {re.sub(r"\s+", "", readable[m]): m for m in functions}
    kernels = []
    for expression in expressions:
        mangled = by_name[re.sub(r"\s+", "", expression)]
        s = stats[mangled]
        kernels.append(KernelSass(filename, expression, s["registers"], s["spill_stores"] + s["spill_loads"],
                                  s["static_smem"], find_loops(parse_sass(functions[mangled]))))
    return kernels


# ------------------------------------------------------------------------------------------ Little's law ---

def blocks_per_sm(registers: int, threads: int, shared: int) -> int:
    """Resident blocks per SM allowed by threads, blocks, registers (per-warp units) and shared memory."""
    warps = -(-threads // WARP)
    per_warp = -(-registers * WARP // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = (REGISTERS_PER_SM // per_warp) // warps
    by_shared = SHARED_PER_SM // (shared + SHARED_RESERVED)
    return max(0, min(THREADS_PER_SM // threads, BLOCKS_PER_SM, by_registers, by_shared))


def littles_law(bytes_in_flight_per_warp: float, warps_per_sm: float, busy_sms: int, latency_ns: float) -> float:
    """Bytes per second a streaming loop can draw: bytes in flight over the whole GPU / latency, capped at HBM."""
    return min(HBM_BYTES_PER_S, busy_sms * warps_per_sm * bytes_in_flight_per_warp / (latency_ns * 1e-9))


def issue_bound(loop: Loop, busy_sms: int) -> float:
    """Bytes per second the loop's instructions allow: one iteration moves loop.load_bytes x 32 bytes per warp and
    costs loop.instructions issue slots (the loop as compiled for the configuration's G, see compile_sass)."""
    return busy_sms * ISSUE_PER_SM_PER_S * loop.load_bytes * WARP / loop.instructions


@dataclass
class Estimate:
    partition_size: int
    blocks: int
    warps_per_sm: float
    kib_in_flight_per_sm: float
    bytes_per_s: float            # K + V bytes over the estimated time

    @property
    def fraction(self) -> float:
        return self.bytes_per_s / HBM_BYTES_PER_S


def estimate_decode(variant: str, kernel: KernelSass, kernel_g: KernelSass, heads: int, kv_heads: int,
                    head_dim: int, elem_bytes: int, batch: int, context: int, num_sms: int,
                    latency_ns: float) -> Estimate:
    """The Little's-law estimate for one paged-decode configuration (see the module docstring): registers and
    loads in flight from the shipped build `kernel`, instructions per iteration from `kernel_g`, built for G."""
    group = heads // kv_heads
    size = choose_partition_size(variant, batch, kv_heads, context, BLOCK_SIZE, group, head_dim, num_sms)
    partitions = -(-context // size)
    blocks = partitions * kv_heads * batch
    threads = decode_threads(variant, head_dim)
    shared = kernel.static_smem + decode_shared_bytes(group, head_dim, size, BLOCK_SIZE, variant)
    busy = min(num_sms, blocks)
    warps = min(blocks_per_sm(kernel.registers, threads, shared), blocks / busy) * (threads // WARP)
    kv_bytes = batch * context * kv_heads * head_dim * elem_bytes            # keys (and as many values)
    seconds = 0.0
    in_flight = []
    for loop, loop_g in zip(kernel.streaming_loops(), kernel_g.streaming_loops()):
        flight = loop.in_flight_bytes * WARP
        in_flight.append(flight)
        seconds += kv_bytes / min(littles_law(flight, warps, busy, latency_ns), issue_bound(loop_g, busy))
    partial_bytes = 2 * batch * heads * partitions * (head_dim + 2) * 4      # written, then read by the merge
    seconds += partial_bytes / HBM_BYTES_PER_S
    return Estimate(size, blocks, warps, warps * max(in_flight) / 1024, 2 * kv_bytes / seconds)


# ---------------------------------------------------------------------------------------------- printing ---

def kernel_table(kernels: list[KernelSass]) -> list[str]:
    header = f"{'kernel':<42}{'regs':>5}{'spill B':>8}{'smem B':>8}  {'loop':<6}{'LDG/iter':>9}{'B/lane':>7}" \
             f"{'in flight':>10}{'before SHFL':>12}"
    lines = [header, "-" * len(header)]
    for k in kernels:
        for label, loop in zip(("main", "value"), k.streaming_loops()):
            if loop is None:
                continue
            label = "key" if label == "main" and "partition" in k.name else label
            lines.append(f"{k.name if label != 'value' else '':<42}{k.registers if label != 'value' else '':>5}"
                         f"{k.spill_bytes if label != 'value' else '':>8}{k.static_smem if label != 'value' else '':>8}"
                         f"  {label:<6}{loop.loads:>9}{loop.load_bytes:>7}{loop.in_flight:>10}"
                         f"{loop.before_shuffle:>12}")
    return lines


def decode_table(partitions: dict, by_group: dict, num_sms: int, latency_ns: float):
    """Old vs new per configuration; returns the lines and the new kernel's estimates for the targets."""
    header = f"{'configuration':<44}{'old: blocks':>12}{'warps/SM':>9}{'KiB/SM':>8}{'TB/s':>6}{'% HBM':>7}  |" \
             f"{'new: part':>10}{'blocks':>7}{'warps/SM':>9}{'KiB/SM':>8}{'TB/s':>6}{'% HBM':>7}"
    lines, results = [header, "-" * len(header)], []
    for model, (H, K, d) in MODELS.items():
        for dtype, (type_name, elem) in DTYPES.items():
            for batch in BATCHES:
                for context in CONTEXTS:
                    row = []
                    for variant in ("simple", "bandwidth"):
                        name = f"{PARTITION_KERNELS[variant]}<{type_name}, {d}>"
                        row.append(estimate_decode(variant, partitions[variant][name], by_group[variant, H // K][name],
                                                   H, K, d, elem, batch, context, num_sms, latency_ns))
                    old, new = row
                    results.append((batch, context, new))
                    label = f"{model.split(' (')[0]} {dtype} B={batch} ctx={context // 1024}k"
                    lines.append(f"{label:<44}{old.blocks:>12}{old.warps_per_sm:>9.1f}{old.kib_in_flight_per_sm:>8.1f}"
                                 f"{old.bytes_per_s / 1e12:>6.2f}{100 * old.fraction:>6.0f}%  |{new.partition_size:>10}"
                                 f"{new.blocks:>7}{new.warps_per_sm:>9.1f}{new.kib_in_flight_per_sm:>8.1f}"
                                 f"{new.bytes_per_s / 1e12:>6.2f}{100 * new.fraction:>6.0f}%")
    return lines, results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minitransformer.kernels.sass_report", description=__doc__
                                     .splitlines()[0])
    parser.add_argument("--latency-ns", type=float, default=LATENCY_NS, help="assumed loaded memory latency")
    parser.add_argument("--sms", type=int, default=DEFAULT_NUM_SMS, help="SMs of the GPU (H200: 132)")
    parser.add_argument("--arch", default=DEFAULT_ARCH)
    args = parser.parse_args(argv)
    nvcc, cuobjdump = find_nvcc(), find_cuobjdump()
    if not nvcc or not cuobjdump:
        print("sass_report: needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)",
              file=sys.stderr)
        return 2
    files = {**KERNEL_FILES, DECODE_VARIANTS["simple"]: decode_expressions("simple")}
    kernels = [k for f, e in files.items() for k in compile_sass(f, e, args.arch, nvcc, cuobjdump)]
    print(f"SASS report for {args.arch} (nvcc, cuobjdump); 'in flight': global loads (LDG) a warp issues per "
          "iteration before the first instruction that uses one; 'before SHFL': before the first warp shuffle\n")
    print("\n".join(kernel_table(kernels)))
    partitions = {v: {k.name: k for k in kernels if k.file == DECODE_VARIANTS[v]} for v in DECODE_VARIANTS}
    by_group = {(v, H // K): {k.name: k for k in compile_sass(DECODE_VARIANTS[v], decode_expressions(v), args.arch,
                                                            nvcc, cuobjdump, max_group=H // K)}
                for v in DECODE_VARIANTS for H, K, _ in MODELS.values()}
    lines, results = decode_table(partitions, by_group, args.sms, args.latency_ns)
    print(f"\nPaged decode on an H200 by Little's law ({args.sms} SMs, {HBM_BYTES_PER_S / 1e12:.1f} TB/s HBM, "
          f"{args.latency_ns:.0f} ns latency, {BLOCK_SIZE}-token cache blocks): old = paged_decode_simple.cu "
          f"(512-token partitions), new = paged_decode.cu (partitions sized by decode_sizing.py)\n")
    print("\n".join(lines))
    problems = [f"{k.name}: {loop.in_flight} loads in flight in a streaming loop (target {TARGET_LOADS})"
                for k in partitions["bandwidth"].values() for loop in k.streaming_loops()
                if loop is not None and "partition" in k.name and loop.in_flight < TARGET_LOADS]
    problems += [f"new kernel at B={b}, ctx={c}: {100 * e.fraction:.0f}% of HBM (target {100 * TARGET_FRACTION:.0f}%)"
                 for b, c, e in results if b >= TARGET_BATCH and e.fraction < TARGET_FRACTION]
    problems += [f"{k.name}: spills {k.spill_bytes} bytes" for k in kernels if k.spill_bytes]
    print(f"\ntargets (new kernel: >= {TARGET_LOADS} loads in flight per warp in the key and value loops, >= "
          f"{100 * TARGET_FRACTION:.0f}% of HBM at B >= {TARGET_BATCH}): " + ("met" if not problems else "MISSED"))
    for problem in problems:
        print(f"  {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

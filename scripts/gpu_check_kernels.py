"""Run the CUDA attention kernels on a real GPU: correctness against the array reference, then speed.

    python scripts/gpu_check_kernels.py [--json gpu_check_kernels.json] [--quick]

Needs CuPy and an NVIDIA GPU, nothing from the network. It
1. runs the kernels through CuPy (the same .cu files and launch code the CPU-runner tests use; both paged decode
   variants) on the test shapes and compares with minitransformer.core.layers.attention on the host (float32
   within 1e-5);
2. measures device-to-device copy bandwidth (bytes read + bytes written per second) as the ceiling;
3. times paged decode at 4k and 32k context with CUDA events, the new kernel (paged_decode.cu, partitions sized for
   this GPU's SMs) next to the old one (paged_decode_simple.cu) and, when torch with CUDA is installed, a plain torch
   decode (gather the blocks, matmul, softmax, matmul); each as achieved bandwidth (the K and V bytes the step must
   read, per second) and as a fraction of the copy ceiling (target for the new kernel: >= 75% at 32k);
4. times flash prefill, and torch.nn.functional.scaled_dot_product_attention on the same tensors when torch with
   CUDA is installed.
Prints a table and writes every number to a JSON file. Exit code 1 when a correctness check fails, 2 without a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # run from a checkout without installing

from minitransformer.core.layers import attention
from minitransformer.kernels.attention import plan_flash_prefill, plan_paged_decode


def gpu_or_exit():
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no GPU visible")
        return cupy
    except Exception as exc:  # ImportError or a CUDA driver error
        print(f"gpu_check_kernels: needs CuPy and an NVIDIA GPU ({type(exc).__name__}: {exc})", file=sys.stderr)
        sys.exit(2)


cp = gpu_or_exit()


def time_gpu(fn, iters: int, warmup: int = 3) -> float:
    """Mean seconds per call of `fn`, between two CUDA events on the current stream (after `warmup` calls)."""
    for _ in range(warmup):
        fn()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) / 1e3 / iters


# ------------------------------------------------------------------------------------------- correctness ---

def reference_prefill(q, k, v):
    B, H, Tq, d = q.shape
    Tk = k.shape[2]
    return attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                     np.broadcast_to(np.arange(Tk - Tq, Tk), (B, Tq)), np.broadcast_to(np.arange(Tk), (B, Tk)))


def reference_paged(q, k_cache, v_cache, tables, lens):
    B, H, d = q.shape
    _, bs, K, _ = k_cache.shape
    outs = []
    for b in range(B):
        n = int(lens[b])
        blocks = tables[b, :-(-n // bs)]
        k = k_cache[blocks].reshape(-1, K, d)[:n].transpose(1, 0, 2)[None].astype(np.float32)
        v = v_cache[blocks].reshape(-1, K, d)[:n].transpose(1, 0, 2)[None].astype(np.float32)
        outs.append(attention(q[b][None, :, None].astype(np.float32), k, v, np.array([[n - 1]]),
                              np.arange(n)[None])[0, :, 0])
    return np.stack(outs)


def make_paged(rng, seq_lens, H, K, d, block_size, dtype):
    """Shuffled block tables; slots past each seq_len hold NaN (they must never be read)."""
    counts = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(counts) + 1
    k_cache = rng.standard_normal((num_blocks, block_size, K, d), dtype=np.float32).astype(dtype)
    v_cache = rng.standard_normal((num_blocks, block_size, K, d), dtype=np.float32).astype(dtype)
    order = rng.permutation(num_blocks)
    tables = np.full((len(seq_lens), max(counts)), 2**30, dtype=np.int32)
    used = 0
    for b, (n, c) in enumerate(zip(seq_lens, counts)):
        tables[b, :c] = order[used:used + c]
        fill = c * block_size - n
        if fill:
            k_cache[tables[b, c - 1], block_size - fill:] = np.nan
            v_cache[tables[b, c - 1], block_size - fill:] = np.nan
        used += c
    q = rng.standard_normal((len(seq_lens), H, d), dtype=np.float32).astype(dtype)
    return q, k_cache, v_cache, tables, np.asarray(seq_lens, dtype=np.int32)


def correctness(rng) -> list[dict]:
    results = []
    for (B, H, K, Tq, Tk, d) in [(1, 9, 3, 1, 37, 64), (2, 9, 3, 20, 20, 64), (1, 9, 3, 20, 40, 128),
                                 (1, 32, 8, 300, 1000, 128)]:
        for dtype, tol in ((np.float32, (1e-5, 1e-5)), (np.float16, (2.0 ** -11, 1e-5))):
            q, k, v = (rng.standard_normal(s, dtype=np.float32).astype(dtype)
                       for s in ((B, H, Tq, d), (B, K, Tk, d), (B, K, Tk, d)))
            out, _ = plan_flash_prefill(cp.asarray(q), cp.asarray(k), cp.asarray(v)).run()
            ref = reference_prefill(q, k, v)
            got = out.get().astype(np.float32)
            ok = bool(np.allclose(got, ref, rtol=tol[0], atol=tol[1]))
            results.append({"kernel": "flash_prefill", "shape": [B, H, K, Tq, Tk, d], "dtype": np.dtype(dtype).name,
                            "max_abs_err": float(np.abs(got - ref).max()), "ok": ok})
    for seq_lens, d, part in [([1, 15, 16, 17, 100, 1000], 64, 16), ([1, 15, 16, 17, 100, 1000], 64, 1024),
                              ([5000, 17, 1], 128, 512), ([5000, 17, 1], 128, None), ([1, 15, 1000], 64, None)]:
        for dtype, tol in ((np.float32, (1e-5, 1e-5)), (np.float16, (2.0 ** -11, 1e-5))):
            for variant in ("bandwidth", "simple"):
                arrays = make_paged(rng, seq_lens, 9, 3, d, 16, dtype)
                out, _ = plan_paged_decode(*(cp.asarray(a) for a in arrays), partition_size=part,
                                           variant=variant).run()
                ref = reference_paged(*arrays)
                got = out.get().astype(np.float32)
                ok = bool(np.allclose(got, ref, rtol=tol[0], atol=tol[1]))
                results.append({"kernel": f"paged_decode ({variant})", "seq_lens": seq_lens, "head_dim": d,
                                "partition_size": part, "dtype": np.dtype(dtype).name,
                                "max_abs_err": float(np.abs(got - ref).max()), "ok": ok})
    return results


# ------------------------------------------------------------------------------------------------- speed ---

def copy_bandwidth(nbytes: int = 2 << 30) -> dict:
    """Device-to-device copy: the practical ceiling for a kernel that streams memory once."""
    src = cp.ones(nbytes // 4, dtype=cp.float32)
    dst = cp.empty_like(src)
    seconds = time_gpu(lambda: dst.data.copy_from_device_async(src.data, nbytes), iters=10)
    return {"bytes_copied": nbytes, "seconds": seconds, "bytes_per_s": 2 * nbytes / seconds}


def decode_inputs(rng, context: int, batch: int, H: int, K: int, d: int, dtype, block_size: int = 16):
    """A full paged cache on the GPU: every sequence `context` tokens long, its blocks shuffled over the pool."""
    blocks_per_seq = context // block_size
    num_blocks = batch * blocks_per_seq
    k_cache = cp.asarray(rng.standard_normal((num_blocks, block_size, K, d), dtype=np.float32).astype(dtype))
    v_cache = cp.asarray(rng.standard_normal((num_blocks, block_size, K, d), dtype=np.float32).astype(dtype))
    tables = cp.asarray(rng.permutation(num_blocks).astype(np.int32).reshape(batch, blocks_per_seq))
    lens = cp.full((batch,), context, dtype=cp.int32)
    q = cp.asarray(rng.standard_normal((batch, H, d), dtype=np.float32).astype(dtype))
    return q, k_cache, v_cache, tables, lens


def paged_decode_speed(inputs, variant: str, copy_bps: float) -> dict:
    """One decode step of our kernel (`variant`), timed; bandwidth = the K and V bytes it must read per second."""
    q, k_cache, v_cache, tables, lens = inputs
    (batch, H, d), (_, block_size, K, _) = q.shape, k_cache.shape
    context = tables.shape[1] * block_size
    plan = plan_paged_decode(q, k_cache, v_cache, tables, lens, variant=variant)
    seconds = time_gpu(plan.run, iters=50)
    kv_bytes = 2 * batch * context * K * d * q.dtype.itemsize                # every key and value read once
    return {"kernel": variant, "context": context, "batch": batch, "heads": H, "kv_heads": K, "head_dim": d,
            "dtype": q.dtype.name, "partitions": int(plan.partials[0].shape[2]), "seconds": seconds,
            "kv_bytes": kv_bytes, "bytes_per_s": kv_bytes / seconds, "fraction_of_copy": kv_bytes / seconds / copy_bps}


def torch_decode_speed(inputs, ours, copy_bps: float) -> dict:
    """The same step in plain torch: gather each sequence's blocks (a copy), q.k, softmax, p.v; timed like ours."""
    import torch
    if not torch.cuda.is_available():
        raise RuntimeError("torch has no CUDA")
    q, k_cache, v_cache, tables, _ = inputs
    (B, H, d), (_, block_size, K, _) = q.shape, k_cache.shape
    tq, tk, tv = (torch.from_dlpack(a) for a in (q, k_cache, v_cache))
    index = torch.from_dlpack(tables).long()                                  # (B, blocks)

    def step():
        k = tk[index].reshape(B, -1, K, d).permute(0, 2, 3, 1)                # (B, K, d, S)
        v = tv[index].reshape(B, -1, K, d).permute(0, 2, 1, 3)                # (B, K, S, d)
        scores = tq.view(B, K, H // K, d) @ k / d ** 0.5                       # (B, K, G, S)
        return (torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v).reshape(B, H, d)

    seconds = time_gpu(step, iters=20)                   # torch and CuPy both use the legacy default stream
    diff = float((step().float() - torch.from_dlpack(ours).float()).abs().max())
    kv_bytes = 2 * B * index.shape[1] * block_size * K * d * q.dtype.itemsize
    return {"kernel": "torch gather+matmul", "torch_version": torch.__version__, "seconds": seconds,
            "bytes_per_s": kv_bytes / seconds, "fraction_of_copy": kv_bytes / seconds / copy_bps,
            "max_abs_diff_vs_ours": diff}


def decode_speeds(rng, cases, copy_bps: float) -> list[dict]:
    """For each (context, batch, H, K, d, dtype): the new kernel, the old one, and torch when it is there."""
    results = []
    for context, batch, H, K, d, dtype in cases:
        inputs = decode_inputs(rng, context, batch, H, K, d, dtype)
        new, old = (paged_decode_speed(inputs, variant, copy_bps) for variant in ("bandwidth", "simple"))
        row = {**new, "old": old}
        try:
            ours = plan_paged_decode(*inputs).run()[0]
            row["torch"] = torch_decode_speed(inputs, ours, copy_bps)
        except Exception as exc:  # torch missing, or CPU-only
            row["torch"] = {"note": f"torch not timed: {type(exc).__name__}: {exc}"}
        results.append(row)
        del inputs
        cp.get_default_memory_pool().free_all_blocks()
    return results


def prefill_speed(rng, B: int, H: int, K: int, T: int, d: int, dtype) -> dict:
    q, k, v = (cp.asarray(rng.standard_normal(s, dtype=np.float32).astype(dtype))
               for s in ((B, H, T, d), (B, K, T, d), (B, K, T, d)))
    plan = plan_flash_prefill(q, k, v)
    seconds = time_gpu(plan.run, iters=10)
    flops = 4 * B * H * d * T * (T + 1) / 2                                 # QK^T and PV over the causal half
    result = {"batch": B, "heads": H, "kv_heads": K, "tokens": T, "head_dim": d, "dtype": np.dtype(dtype).name,
              "seconds": seconds, "tflops": flops / seconds / 1e12, "torch_sdpa_seconds": None,
              "torch_note": None}
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch has no CUDA")
        tq, tk, tv = (torch.from_dlpack(a) for a in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def run_sdpa():
            sdpa(tq, tk, tv, is_causal=True, enable_gqa=(H != K))

        torch_seconds = time_gpu(run_sdpa, iters=10)     # torch and CuPy both use the legacy default stream
        ours = plan.run()[0]
        err = (torch.from_dlpack(ours).float() - sdpa(tq, tk, tv, is_causal=True, enable_gqa=(H != K)).float())
        result.update(torch_sdpa_seconds=torch_seconds, torch_version=torch.__version__,
                      max_abs_diff_vs_torch=float(err.abs().max()), ratio_ours_over_torch=seconds / torch_seconds)
    except Exception as exc:  # torch missing, CPU-only, or too old for enable_gqa
        result["torch_note"] = f"torch SDPA not timed: {type(exc).__name__}: {exc}"
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default="gpu_check_kernels.json", help="where to write the numbers")
    parser.add_argument("--quick", action="store_true", help="skip the 32k-context and the largest prefill runs")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    report = {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
              "cupy": cp.__version__, "python": platform.python_version(), "when": time.strftime("%Y-%m-%d %H:%M:%S")}

    report["correctness"] = correctness(rng)
    failed = [r for r in report["correctness"] if not r["ok"]]
    print(f"device: {report['device']} (CuPy {cp.__version__})")
    print(f"correctness: {len(report['correctness']) - len(failed)}/{len(report['correctness'])} cases within "
          "tolerance (float32 1e-5; float16 2^-11 relative + 1e-5)")
    for r in failed:
        print(f"  FAILED {r}")

    copy = copy_bandwidth()
    report["copy"] = copy
    decode_cases = [(ctx, batch, 32, 8, 128, dtype) for ctx, batch in [(4096, 32), (32768, 4), (32768, 8)]
                    for dtype in (np.float16, np.float32)]
    decode_cases += [(ctx, 8, 9, 3, 64, np.float16) for ctx in (4096, 32768)]          # SmolLM2's heads
    if args.quick:
        decode_cases = [(4096, 32, 32, 8, 128, np.float16), (32768, 8, 32, 8, 128, np.float16)]
    report["paged_decode"] = decode_speeds(rng, decode_cases, copy["bytes_per_s"])
    prefill_cases = [(1, 32, 8, 4096, 128)] if not args.quick else [(1, 32, 8, 1024, 128)]
    report["flash_prefill"] = [prefill_speed(rng, *case, dtype) for case in prefill_cases
                               for dtype in (np.float16, np.float32)]

    print(f"\ndevice-to-device copy: {copy['bytes_per_s'] / 1e12:.2f} TB/s (read + write)")
    print(f"\n{'paged decode (% of copy bandwidth)':<40}{'new us':>9}{'new %':>7}{'old us':>9}{'old %':>7}"
          f"{'torch us':>10}{'torch %':>8}")
    for r in report["paged_decode"]:
        label = f"ctx {r['context']} x B {r['batch']} H{r['heads']}/K{r['kv_heads']} d{r['head_dim']} {r['dtype']}"
        old, torch_row = r["old"], r["torch"]
        torch_cells = (f"{torch_row['seconds'] * 1e6:>10.1f}{100 * torch_row['fraction_of_copy']:>7.1f}%"
                       if "seconds" in torch_row else f"{'-':>10}{'-':>8}")
        print(f"{label:<40}{r['seconds'] * 1e6:>9.1f}{100 * r['fraction_of_copy']:>6.1f}%{old['seconds'] * 1e6:>9.1f}"
              f"{100 * old['fraction_of_copy']:>6.1f}%{torch_cells}")
        if "note" in torch_row:
            print(f"  {torch_row['note']}")
    print(f"\n{'flash prefill (causal)':<40}{'ours ms':>10}{'TFLOP/s':>10}{'torch ms':>11}{'ours/torch':>12}")
    for r in report["flash_prefill"]:
        label = f"B {r['batch']} T {r['tokens']} H{r['heads']}/K{r['kv_heads']} d{r['head_dim']} {r['dtype']}"
        torch_ms = f"{r['torch_sdpa_seconds'] * 1e3:.3f}" if r["torch_sdpa_seconds"] else "-"
        ratio = f"{r['ratio_ours_over_torch']:.1f}x" if r["torch_sdpa_seconds"] else "-"
        print(f"{label:<40}{r['seconds'] * 1e3:>10.3f}{r['tflops']:>10.2f}{torch_ms:>11}{ratio:>12}")
        if r["torch_note"]:
            print(f"  {r['torch_note']}")

    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nwrote {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

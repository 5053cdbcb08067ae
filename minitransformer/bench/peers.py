"""The peers `minitransformer bench` compares us with, behind the method names of workloads.Ours.

    HF        transformers' LlamaForCausalLM on torch (CPU, float32, default threads = cores), loading the same GGUF
    LlamaCpp  llama-cpp-python on the same GGUF (its own quantized kernels), n_threads = cores, n_batch = 512:
              in-process prefill and batch-1 decode (its Python API decodes one sequence at a time)
    LlamaBatchedBench  llama.cpp's own batched decode: the `llama-batched-bench` tool (tools/batched-bench of the
              llama.cpp that llama-cpp-python vendors; scripts/setup_peers.py builds it), run as a process with
              -t cores; decode at batch B and the continuous-batching workload, from the PP/TG table it prints

All are optional: constructing one never raises; `available()` says whether it loaded and `reason` why not (the
import error, a missing file). Nothing is ever downloaded. Definitions, matching workloads.py:

    HF prefill P          one model(ids, use_cache=True) forward under torch.no_grad(), timed
    HF decode at batch B  generate(max_new_tokens=min_new_tokens=n, greedy) timed for n = N + 1 and n = 1:
                          B * N / (t(N+1) - t(1)), which removes the prefill and the first token
    HF generate           generate(use_cache=True|False) end to end for N new tokens -> (seconds, ids)
    llama-cpp-python prefill P   llm.reset(); llm.eval(ids), timed (prompt processing, pp)
    llama-cpp-python decode      batch 1 only (no batched API here): after eval(prompt), N single-token evals, each
                          token the previous logits' argmax (greedy, fixed length, no EOS stop) -> N / seconds (tg)
    batched-bench decode B   llama-batched-bench -npp P -ntg N -npl B: B prompts of P tokens prefilled, then N
                          steps that each decode one token of all B sequences -> its S_TG column, B * N / t_tg
    batched-bench continuous the same number of requests at once, each prompt as long as our prompts' mean (so the
                          prefill work is the same), -ntg N - 1 (the prefill yields each first token, as in ours) ->
                          B * N / (t_pp + t_tg): every generated token over the wall time, prefill included, the
                          figure our Engine's continuous batching is measured by
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np

from . import peer_cache
from .workloads import timed


class HF:
    """HF transformers, torch CPU, float32."""
    name = "hf"

    def __init__(self, model_path):
        self.model, self.reason = None, None
        try:
            import torch
            from transformers import LlamaForCausalLM
            from transformers.utils import logging as hf_logging
        except Exception as exc:                                  # ImportError, or a broken install
            self.reason = f"transformers/torch not importable: {exc}"
            return
        path = Path(model_path)
        try:
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()                    # rich's bar is the only one on stderr
            self.torch = torch
            self.model = LlamaForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32).eval()
        except Exception as exc:
            self.reason = f"transformers could not load {path.name}: {str(exc).splitlines()[0] if str(exc) else exc}"
            self.model = None

    def available(self) -> bool:
        return self.model is not None

    def supports(self, workload: str, batch: int = 1) -> bool:
        return workload != "continuous"

    def versions(self) -> dict:
        import torch
        import transformers
        return {"torch": torch.__version__, "transformers": transformers.__version__,
                "torch_threads": torch.get_num_threads()}

    def prefill_seconds(self, ids: list[int]) -> float:
        torch = self.torch
        inp = torch.tensor([ids])                                              # (1, P)
        with torch.no_grad():
            return timed(lambda: self.model(inp, use_cache=True))[0]

    def _generate(self, inp, new_tokens: int, use_cache: bool = True):
        """-> (seconds, output ids (B, T + n)) of a greedy, fixed-length generate."""
        torch = self.torch
        mask = torch.ones_like(inp)
        with torch.no_grad():
            return timed(lambda: self.model.generate(inp, attention_mask=mask, max_new_tokens=new_tokens,
                                                     min_new_tokens=new_tokens, do_sample=False,
                                                     use_cache=use_cache, pad_token_id=0))

    def decode_tok_s(self, batch: int, ids: list[int], new_tokens: int) -> float:
        inp = self.torch.tensor([list(ids)] * batch)                           # (B, T)
        for _ in range(3):                    # on a loaded machine t(1) can exceed t(N+1): measure the pair again
            long, _ = self._generate(inp, new_tokens + 1)
            short, _ = self._generate(inp, 1)
            if long > short:
                return batch * new_tokens / (long - short)
        raise RuntimeError(f"HF decode at batch {batch}: generate({new_tokens + 1}) was not slower than "
                           "generate(1) in 3 tries; the machine is too loaded to measure")

    def generate_seconds(self, ids: list[int], new_tokens: int, use_cache: bool) -> tuple[float, list[int]]:
        seconds, out = self._generate(self.torch.tensor([ids]), new_tokens, use_cache)
        return seconds, out[0, len(ids):].tolist()


class LlamaCpp:
    """llama-cpp-python: prompt processing and single-stream decode."""
    name = "llama-cpp-python"

    def __init__(self, model_path, n_ctx: int = 2048):
        self.llm, self.reason = None, None
        try:
            import llama_cpp
        except Exception as exc:
            self.reason = f"llama_cpp not importable: {exc}"
            return
        self.version = getattr(llama_cpp, "__version__", "?")
        try:
            self.llm = llama_cpp.Llama(model_path=str(model_path), n_ctx=n_ctx, n_threads=os.cpu_count(),
                                       n_batch=512, verbose=False)
        except Exception as exc:
            self.reason = f"llama.cpp could not load {Path(model_path).name}: {exc}"
            self.llm = None

    def available(self) -> bool:
        return self.llm is not None

    def supports(self, workload: str, batch: int = 1) -> bool:
        return workload in ("prefill", "decode") and batch == 1

    def versions(self) -> dict:
        return {"llama_cpp": self.version, "llama_cpp_threads": os.cpu_count()}

    def prefill_seconds(self, ids: list[int]) -> float:
        self.llm.reset()
        return timed(lambda: self.llm.eval(ids))[0]

    def _next_token(self) -> int:
        """Argmax of the last evaluated position's logits (without logits_all llama.cpp keeps only that row)."""
        logits = np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.llm.n_vocab(),))   # (V,)
        return int(np.argmax(logits))

    def _decode_seconds(self, ids: list[int], steps: int) -> float:
        """eval(ids) untimed, then `steps` greedy single-token evals, timed -> their seconds."""
        self.llm.reset()
        self.llm.eval(ids)
        token = self._next_token()

        def run(token=token):
            for _ in range(steps):
                self.llm.eval([token])
                token = self._next_token()
        return timed(run)[0]

    def decode_tok_s(self, batch: int, ids: list[int], new_tokens: int) -> float:
        if batch != 1:
            raise ValueError("llama.cpp is measured at batch 1 only")
        return new_tokens / self._decode_seconds(ids, new_tokens)



def parse_batched_bench(text: str) -> list[dict]:
    """llama-batched-bench's `--output-format jsonl` table -> one dict per (pp, tg, pl) row, its own keys: pp, tg, pl,
    n_kv, t_pp and t_tg (seconds), speed_pp and speed_tg (tokens/s), t, speed. Lines that are not rows (its log, if
    mixed in) are skipped."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            if {"pp", "tg", "pl", "t_pp", "t_tg"} <= set(row):
                rows.append(row)
    return rows


def batched_bench_argv(binary: Path, model_path, prompt: int, new: int, batch: int, threads: int) -> list[str]:
    """One batched-bench run: `batch` distinct prompts of `prompt` tokens (-pps off), `new` decode steps. The
    context must hold every sequence: batch * (prompt + new) cells, rounded up to 256."""
    context = 256 * math.ceil(batch * (prompt + new) / 256)
    return [str(binary), "-m", str(model_path), "-c", str(context), "-b", "2048", "-ub", "512", "-npp", str(prompt),
            "-ntg", str(new), "-npl", str(batch), "-t", str(threads), "-tb", str(threads), "--output-format", "jsonl"]


class LlamaBatchedBench:
    """llama.cpp's batched decode, through its llama-batched-bench tool (one process per measurement)."""
    name = "llama-batched-bench"

    def __init__(self, model_path):
        self.model_path, self.binary = Path(model_path), peer_cache.llama_binary("llama-batched-bench")
        self.reason = peer_cache.llama_missing("llama-batched-bench")
        if self.reason is None and not self.model_path.is_file():
            self.reason = f"no model file {self.model_path}"
        self.threads = os.cpu_count() or 1

    def available(self) -> bool:
        return self.reason is None

    def supports(self, workload: str, batch: int = 1) -> bool:
        return workload in ("decode", "continuous")

    def versions(self) -> dict:
        return {"llama_batched_bench": f"{self.binary} (llama-cpp-python {peer_cache.LLAMA_CPP_PYTHON_VERSION}'s "
                                       "vendored llama.cpp)", "llama_batched_bench_threads": self.threads}

    def run(self, prompt: int, new: int, batch: int) -> dict:
        """The table row of one batched-bench run."""
        argv = batched_bench_argv(self.binary, self.model_path, prompt, new, batch, self.threads)
        done = subprocess.run(argv, capture_output=True, text=True, env=peer_cache.llama_env(self.binary),
                              timeout=3600)
        rows = parse_batched_bench(done.stdout)
        if done.returncode != 0 or len(rows) != 1:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise RuntimeError(f"llama-batched-bench exited with code {done.returncode} and {len(rows)} table rows: "
                               f"{tail}")
        return rows[0]

    def decode_tok_s(self, batch: int, ids: list[int], new_tokens: int) -> float:
        return self.run(len(ids), new_tokens, batch)["speed_tg"]

    def continuous_tok_s(self, prompts: list, new_tokens: int) -> float:
        mean_prompt = round(sum(len(p) for p in prompts) / len(prompts))
        row = self.run(mean_prompt, new_tokens - 1, len(prompts))
        return len(prompts) * new_tokens / (row["t_pp"] + row["t_tg"])


PEERS = {"hf": HF, "llama-cpp-python": LlamaCpp, "llama-batched-bench": LlamaBatchedBench}

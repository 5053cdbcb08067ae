"""The peers `minitransformer bench` compares us with, behind the method names of workloads.Ours.

    HF        transformers' LlamaForCausalLM on torch (CPU, float32, default threads = cores), loading the same GGUF
    LlamaCpp  llama-cpp-python on the same GGUF (its own quantized kernels), n_threads = cores, n_batch = 512

Both are optional: constructing one never raises; `available()` says whether it loaded and `reason` why not (the
import error, a missing file). Nothing is ever downloaded. Definitions, matching workloads.py:

    HF prefill P          one model(ids, use_cache=True) forward under torch.no_grad(), timed
    HF decode at batch B  generate(max_new_tokens=min_new_tokens=n, greedy) timed for n = N + 1 and n = 1:
                          B * N / (t(N+1) - t(1)), which removes the prefill and the first token
    HF generate           generate(use_cache=True|False) end to end for N new tokens -> (seconds, ids)
    llama.cpp prefill P   llm.reset(); llm.eval(ids), timed (prompt processing, pp)
    llama.cpp decode      batch 1 only (no batched API here): after eval(prompt), N single-token evals, each token
                          the argmax of the previous logits (greedy, fixed length, no EOS stop) -> N / seconds (tg)
    llama.cpp continuous  the same requests served one after another (single stream): for each, eval(prompt) (not
                          timed), then N - 1 single-token evals -> decode tokens / decode seconds of all requests:
                          the single-stream decode tok/s that continuous batching is compared with, measured in the
                          same rounds as our engine (so a slow spell of the machine hits both)
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

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
    name = "llama.cpp"

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
        return workload in ("prefill", "decode", "continuous") and batch == 1

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

    def continuous_tok_s(self, prompts: list, new_tokens: int) -> float:
        seconds = sum(self._decode_seconds(list(ids), new_tokens - 1) for ids in prompts)
        return len(prompts) * (new_tokens - 1) / seconds


PEERS = {"hf": HF, "llama.cpp": LlamaCpp}

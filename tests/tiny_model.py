"""A tiny random-weight llama model written as a real GGUF file with gguf's writer.

Unit tests load it through the same path as the real model (open_gguf -> ModelConfig -> Tokenizer -> dequantize),
so the loader is exercised too, and they stay fast: 2 layers, d_model 64, 4 query heads sharing 2 KV heads.
Tensors mix F32, Q8_0 and Q4_1 like the real file. The vocabulary is the 256 byte symbols plus a few merges and the
ChatML control tokens, so text round-trips through the tokenizer.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from minitransformer.tokenizer import bytes_to_unicode

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n"]

DIMS = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128, context_length=128)

# Which type each weight is stored in (everything not listed: F32).
DEFAULT_TYPES = {"token_embd.weight": Q.Q8_0, "attn_q.weight": Q.Q4_1, "attn_k.weight": Q.Q4_1,
                 "ffn_gate.weight": Q.Q4_1, "ffn_up.weight": Q.Q4_1, "ffn_down.weight": Q.Q4_1}


def vocabulary() -> tuple[list[str], list[int]]:
    byte_symbols = list(bytes_to_unicode().values())
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = CONTROL_TOKENS + byte_symbols + merged
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))   # 3 = CONTROL, 1 = NORMAL
    return tokens, types


def write_tiny_llama(path: str | Path, seed: int = 0, arch: str = "llama", tied: bool = True,
                     types: dict | None = None) -> Path:
    """Write the tiny model to `path` and return it. `types` overrides the storage type of tensors by suffix
    (e.g. {"attn_v.weight": Q.Q8_1}) to produce files the loader must refuse."""
    path = Path(path)
    d = DIMS
    rng = np.random.default_rng(seed)
    tokens, token_types = vocabulary()
    vocab = len(tokens)
    kinds = {**DEFAULT_TYPES, **(types or {})}

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-random-llama")
    writer.add_block_count(d["n_layers"])
    writer.add_context_length(d["context_length"])
    writer.add_embedding_length(d["d_model"])
    writer.add_feed_forward_length(d["ffn_dim"])
    writer.add_head_count(d["n_heads"])
    writer.add_head_count_kv(d["n_kv_heads"])
    writer.add_rope_dimension_count(d["head_dim"])
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)

    def add(name: str, shape: tuple, scale: float = 0.1, ones: bool = False):
        values = (np.ones(shape) + rng.normal(0, 0.05, shape) if ones else rng.normal(0, scale, shape))
        values = values.astype(np.float32)
        kind = next((k for suffix, k in kinds.items() if name.endswith(suffix)), Q.F32)
        if kind == Q.F32:
            writer.add_tensor(name, values)
        elif kind == Q.Q8_1:          # gguf cannot quantize to Q8_1: write zero blocks of the right byte size
            block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = np.zeros((shape[0], shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=kind)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    D, F, H, K, hd = d["d_model"], d["ffn_dim"], d["n_heads"], d["n_kv_heads"], d["head_dim"]
    add("token_embd.weight", (vocab, D), scale=1.0)
    for i in range(d["n_layers"]):
        add(f"blk.{i}.attn_norm.weight", (D,), ones=True)
        add(f"blk.{i}.attn_q.weight", (H * hd, D))
        add(f"blk.{i}.attn_k.weight", (K * hd, D))
        add(f"blk.{i}.attn_v.weight", (K * hd, D))
        add(f"blk.{i}.attn_output.weight", (D, H * hd))
        add(f"blk.{i}.ffn_norm.weight", (D,), ones=True)
        add(f"blk.{i}.ffn_gate.weight", (F, D))
        add(f"blk.{i}.ffn_up.weight", (F, D))
        add(f"blk.{i}.ffn_down.weight", (D, F))
    add("output_norm.weight", (D,), ones=True)
    if not tied:
        add("output.weight", (vocab, D))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

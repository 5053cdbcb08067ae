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

from minitransformer.core.tokenizer import bytes_to_unicode

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


def tiny_tensors(vocab: int, seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    """The float32 values of every tensor, in NumPy's (out, in) order, before any quantization."""
    d = DIMS
    rng = np.random.default_rng(seed)
    D, F, H, K, hd = d["d_model"], d["ffn_dim"], d["n_heads"], d["n_kv_heads"], d["head_dim"]

    def normal(*shape, scale=0.1):
        return rng.normal(0, scale, shape).astype(np.float32)

    def near_one(n):
        return (1.0 + rng.normal(0, 0.05, n)).astype(np.float32)

    tensors = {"token_embd.weight": normal(vocab, D, scale=1.0)}
    for i in range(d["n_layers"]):
        p = f"blk.{i}."
        tensors.update({
            p + "attn_norm.weight": near_one(D),
            p + "attn_q.weight": normal(H * hd, D),
            p + "attn_k.weight": normal(K * hd, D),
            p + "attn_v.weight": normal(K * hd, D),
            p + "attn_output.weight": normal(D, H * hd),
            p + "ffn_norm.weight": near_one(D),
            p + "ffn_gate.weight": normal(F, D),
            p + "ffn_up.weight": normal(F, D),
            p + "ffn_down.weight": normal(D, F),
        })
    tensors["output_norm.weight"] = near_one(D)
    if not tied:
        tensors["output.weight"] = normal(vocab, D)
    return tensors


def write_tiny_llama(path: str | Path, seed: int = 0, arch: str = "llama", tied: bool = True,
                     types: dict | None = None, extra: dict | None = None, metadata: dict | None = None) -> Path:
    """Write the tiny model to `path` and return it. `types` overrides the storage type of tensors by suffix
    (e.g. {"attn_v.weight": Q.Q8_1}) to produce files the loader must refuse; `extra` adds float32 tensors by name
    (e.g. a bias); `metadata` adds key-values (str, int or float) the writer does not already write."""
    path = Path(path)
    d = DIMS
    tokens, token_types = vocabulary()
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
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    for key, value in (metadata or {}).items():
        add = writer.add_string if isinstance(value, str) else writer.add_uint32 if isinstance(value, int) \
            else writer.add_float32
        add(key, value)

    for name, values in {**tiny_tensors(len(tokens), seed, tied), **(extra or {})}.items():
        kind = next((k for suffix, k in kinds.items() if name.endswith(suffix)), Q.F32)
        if kind == Q.F32:
            writer.add_tensor(name, values)
        elif kind == Q.Q8_1:          # gguf cannot quantize to Q8_1: write zero blocks of the right byte size
            block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = np.zeros((values.shape[0], values.shape[1] // block * size), dtype=np.uint8)
            writer.add_tensor(name, raw, raw_dtype=kind)
        else:
            writer.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# A tiny SentencePiece-style vocabulary (tokenizer.ggml.model "llama"): control tokens, a user-defined token, the 256
# byte tokens, then pieces with scores chosen so the merge order is known by hand: "▁a" beats "ab" beats "bc", and
# "abc" is a token only reachable through "ab" + "c" or "a" + "bc".
SPM_CONTROL = ["<pad>", "<eos>", "<bos>", "<unk>", "<end_of_turn>"]
SPM_USER_DEFINED = ["<b>", "\n\n"]
SPM_PIECES = {"a": -1.0, "b": -2.0, "c": -3.0, "▁": -4.0, "▁a": -5.0, "ab": -6.0, "bc": -7.0, "abc": -8.0,
              "aa": -9.0, "▁ab": -10.0, "é": -11.0, "\n": -12.0}


def spm_vocabulary() -> tuple[list[str], list[int], list[float]]:
    tokens = SPM_CONTROL + SPM_USER_DEFINED + [f"<0x{b:02X}>" for b in range(256)] + list(SPM_PIECES)
    types = [3] * len(SPM_CONTROL) + [4] * len(SPM_USER_DEFINED) + [6] * 256 + [1] * len(SPM_PIECES)
    scores = [0.0] * (len(tokens) - len(SPM_PIECES)) + list(SPM_PIECES.values())
    return tokens, types, scores


def write_tiny_spm(path: str | Path, add_space_prefix: bool = False) -> Path:
    """A GGUF holding only a SentencePiece-style tokenizer (no tensors: load_tokenizer reads the metadata alone)."""
    path = Path(path)
    tokens, types, scores = spm_vocabulary()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

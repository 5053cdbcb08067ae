"""ModelConfig: the architecture numbers of a llama-family model, read from GGUF metadata.

Nothing in the model code hard-codes SmolLM2's sizes; they all come from here. For the default model:
30 layers, d_model 576, 9 query heads sharing 3 KV heads (GQA 3:1), head_dim 64, FFN 1536, RoPE base 100000,
context 8192, vocab 49152, tied embeddings, interleaved RoPE pairs, no biases.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelFileError

# general.architecture -> which dimensions RoPE rotates together (layers.apply_rope). The file does not say: its
# architecture decides, as in llama.cpp's llama_model_rope_type (llama: interleaved pairs, "NORM"; qwen2, gemma3,
# phi3 and others: split halves, "NEOX"). An architecture runs here only once it has an entry.
ROPE_PAIRING = {"llama": "interleaved"}
ROPE_PAIRINGS = ("interleaved", "neox")
SUPPORTED_ARCHITECTURES = tuple(ROPE_PAIRING)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    n_layers: int
    d_model: int
    n_heads: int           # query heads
    n_kv_heads: int        # key/value heads (fewer than n_heads: grouped-query attention)
    head_dim: int
    ffn_dim: int           # hidden size of the SwiGLU feed-forward
    norm_eps: float        # RMSNorm epsilon
    rope_base: float       # RoPE theta
    context_length: int    # the longest sequence the model was trained for
    vocab_size: int
    tied_embeddings: bool  # lm_head reuses token_embd (no output.weight tensor)
    rope_pairing: str = "interleaved"   # "interleaved" (x[2i], x[2i+1]) or "neox" (x[i], x[i + d/2]): ROPE_PAIRING
    bias_tensors: tuple[str, ...] = ()  # layer tensors the file gives a bias ("attn_q" for blk.N.attn_q.bias)

    def __post_init__(self):
        if self.rope_pairing not in ROPE_PAIRINGS:
            raise ValueError(f"rope_pairing must be one of {ROPE_PAIRINGS}, got {self.rope_pairing!r}")

    @property
    def group_size(self) -> int:
        """Query heads per KV head (3 for SmolLM2-135M)."""
        return self.n_heads // self.n_kv_heads

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @classmethod
    def from_gguf(cls, reader) -> ModelConfig:
        """Read the config from a `gguf.GGUFReader`; one clear error for anything we cannot run."""
        arch = _field(reader, "general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelFileError(f"unsupported model architecture {arch!r}; minitransformer runs: "
                                 f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        n_heads = int(_field(reader, f"{arch}.attention.head_count"))
        n_kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", n_heads))
        d_model = int(_field(reader, f"{arch}.embedding_length"))
        if n_heads < 1 or n_kv_heads < 1:
            raise ModelFileError(f"GGUF metadata gives {n_heads} attention heads and {n_kv_heads} KV heads; "
                                 "both must be at least 1")
        head_dim = int(_field(reader, f"{arch}.rope.dimension_count", d_model // n_heads))
        tensor_names = {t.name for t in reader.tensors}
        biases = sorted(name[len("blk.0."):-len(".bias")] for name in tensor_names
                        if name.startswith("blk.0.") and name.endswith(".bias"))
        embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        if embd is None:
            raise ModelFileError("GGUF has no token_embd.weight tensor; not a llama-architecture model file")
        vocab = int(_field(reader, f"{arch}.vocab_size", int(embd.shape[-1])))
        config = cls(
            name=str(_field(reader, "general.name", "unnamed")),
            n_layers=int(_field(reader, f"{arch}.block_count")),
            d_model=d_model,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            ffn_dim=int(_field(reader, f"{arch}.feed_forward_length")),
            norm_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_base=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
            context_length=int(_field(reader, f"{arch}.context_length")),
            vocab_size=vocab,
            tied_embeddings="output.weight" not in tensor_names,
            rope_pairing=ROPE_PAIRING[arch],
            bias_tensors=tuple(biases),
        )
        if head_dim * n_heads != d_model or n_heads % config.n_kv_heads or head_dim % 2:
            raise ModelFileError(f"unsupported head layout: {n_heads} heads x head_dim {head_dim} vs d_model "
                                 f"{d_model}, {config.n_kv_heads} KV heads (need n_heads*head_dim == d_model, "
                                 "n_heads divisible by n_kv_heads, even head_dim)")
        return config


_MISSING = object()


def _field(reader, key: str, default=_MISSING):
    """One metadata value (str, int, float, bool, or list) from a GGUFReader."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ModelFileError(f"GGUF metadata is missing {key!r}; not a complete llama-architecture model file")
        return default
    return field.contents()

"""ModelConfig: the architecture numbers of a llama-family model, read from GGUF metadata.

Nothing in the model code hard-codes SmolLM2's sizes; they all come from here. For the default model:
30 layers, d_model 576, 9 query heads sharing 3 KV heads (GQA 3:1), head_dim 64, FFN 1536, RoPE base 100000,
context 8192, vocab 49152, tied embeddings, interleaved RoPE pairs, no biases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ModelFileError

ROPE_PAIRINGS = ("interleaved", "neox")
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class Family:
    """What one architecture (GGUF general.architecture) changes from llama's forward, as data: the loader reads it
    into ModelConfig's fields and the forward reads those, so no code elsewhere names a family. FAMILIES holds every
    family we run; a new one is a row there. Where a value is not in the file, the source that fixes it is named in
    FAMILIES' comments (llama.cpp's and HF transformers' code for the family).

    rope_pairing: which dimensions RoPE rotates together. The file does not say: the architecture decides, as in
    llama.cpp's llama_model_rope_type (llama: interleaved pairs, "NORM"; qwen2, qwen3, gemma3: halves, "NEOX").
    global_every: 0, or a period p: layer i slides unless i % p == p - 1 (a file may give another p as
    attention.sliding_window_pattern); sliding windows in a file of a family without it are refused.
    """
    rope_pairing: str
    qk_norm: bool = False               # an RMSNorm of each q and k head before RoPE (attn_q_norm, attn_k_norm)
    sandwich_norms: bool = False        # an RMSNorm of attention's and the FFN's outputs before each residual add
    activation: str = "silu"            # the gated FFN's: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    scale_embedding: bool = False       # the token vectors are multiplied by sqrt(d_model)
    global_every: int = 0               # sliding layers: every global_every-th layer attends to everything
    rope_base_local: float = 0.0        # the sliding layers' RoPE theta when the file gives none (rope.freq_base_swa)
    heads_span_d_model: bool = False    # n_heads x head_dim == d_model must hold
    query_scale_by_width: tuple[int, ...] = ()   # set: q is scaled explicitly, by 1/sqrt(head_dim), or by
                                                 # 1/sqrt(d_model / n_heads) for a model with one of these layer counts


FAMILIES = {
    # Llama 2 and 3 (Llama 3's RoPE frequency factors come from the file's rope_freqs tensor), SmolLM2
    "llama": Family("interleaved", heads_span_d_model=True),
    # Gemma 3 (llama.cpp src/models/gemma3.cpp, llama-hparams.cpp; HF configuration_gemma3.py, modeling_gemma3.py):
    # - layer i slides unless i % 6 == 5 (load_swa_pattern(ml, 6) and set_swa_pattern: swa when il % 6 < 5; HF
    #   "sliding_attention" when (i + 1) % 6 != 0); the window is attention.sliding_window: key k is masked for query
    #   p when p - k >= window (llama_hparams::is_masked_swa; HF sliding_window_overlay keeps kv_idx > q_idx - window)
    # - local RoPE base 10,000 (llama-hparams.h rope_freq_base_train_swa; HF default_theta["local"]); global from
    #   rope.freq_base (1e6)
    # - embedding scale sqrt(d_model) (ggml_scale(inpL, sqrtf(n_embd)); HF Gemma3TextScaledWordEmbedding), GELU with
    #   the tanh approximation in the gated FFN (LLM_FFN_GELU; HF "gelu_pytorch_tanh")
    # - q scale 1/sqrt(head_dim), except the 62-layer 27B's 1/sqrt(d_model / n_heads) (f_attention_scale, after
    #   gemma_pytorch's query_pre_attn_scalar; HF query_pre_attn_scalar, 256 = head_dim for 270M)
    # - norms: the GGUF already holds Gemma's (1 + w) (the converter's Gemma3Model.norm_shift adds 1 to every
    #   *norm.weight), so the plain RMSNorm applies; Q and K are not permuted (Gemma3Model does not inherit
    #   LlamaModel's permute), hence the halves pairing
    "gemma3": Family("neox", qk_norm=True, sandwich_norms=True, activation="gelu_tanh", scale_embedding=True,
                     global_every=6, rope_base_local=10_000.0, query_scale_by_width=(62,)),
    # Qwen2: biases on q, k and v, from the file's tensors (ModelConfig.bias_tensors)
    "qwen2": Family("neox"),
    # Qwen3: an RMSNorm per q and k head, its scale stored as is (HF modeling_qwen3.py Qwen3Attention q_norm / k_norm;
    # llama.cpp src/models/qwen3.cpp build_norm of Qcur / Kcur per head)
    "qwen3": Family("neox", qk_norm=True),
}
SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
QKV_TENSORS = ("attn_q", "attn_k", "attn_v")


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
    family: str = "llama"               # general.architecture: its row of FAMILIES
    rope_pairing: str = "interleaved"   # "interleaved" (x[2i], x[2i+1]) or "neox" (x[i], x[i + d/2]): the family's
    bias_tensors: tuple[str, ...] = ()  # layer tensors the file gives a bias ("attn_q" for blk.N.attn_q.bias)
    rope_freq_factors: tuple[float, ...] = ()  # Llama 3: pair i's angle is divided by factor i (rope_freqs.weight)
    # What other families change (FAMILIES says which, and where each value comes from); the defaults are llama's,
    # so a llama model pays nothing for them.
    qk_norm: bool = False               # an RMSNorm on each query and key head before RoPE (attn_q_norm, attn_k_norm;
                                        # Gemma 3 and Qwen3)
    sandwich_norms: bool = False        # an RMSNorm on attention's and the FFN's outputs before each residual add
    activation: str = "silu"            # the gated FFN's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embedding_scale: float = 1.0        # the token vectors are multiplied by this (Gemma: sqrt(d_model))
    attention_scale: float = 0.0        # scores = q.k * this; 0 means 1/sqrt(head_dim)
    sliding_window: int = 0             # a sliding layer's query at p sees keys in (p - window, p]; 0: none
    sliding_layers: tuple[int, ...] = ()  # which layers slide (the others attend to everything before them)
    rope_base_local: float = 0.0        # the sliding layers' RoPE theta (0: the same rope_base)

    def __post_init__(self):
        if self.rope_pairing not in ROPE_PAIRINGS:
            raise ValueError(f"rope_pairing must be one of {ROPE_PAIRINGS}, got {self.rope_pairing!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")

    @property
    def qkv_bias(self) -> bool:
        """Qwen2: q, k and v each add a bias (loading.check_biases refuses any other bias)."""
        return all(t in self.bias_tensors for t in QKV_TENSORS)

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
        if arch not in FAMILIES:
            raise ModelFileError(f"unsupported model architecture {arch!r}; minitransformer runs: "
                                 f"{', '.join(SUPPORTED_ARCHITECTURES)}")
        family = FAMILIES[arch]
        n_heads = int(_field(reader, f"{arch}.attention.head_count"))
        n_kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", n_heads))
        d_model = int(_field(reader, f"{arch}.embedding_length"))
        n_layers = int(_field(reader, f"{arch}.block_count"))
        if n_heads < 1 or n_kv_heads < 1:
            raise ModelFileError(f"GGUF metadata gives {n_heads} attention heads and {n_kv_heads} KV heads; "
                                 "both must be at least 1")
        # a head's size may be given apart from d_model (Gemma 3 270M: 4 heads x 256 != d_model 640)
        head_dim = int(_field(reader, f"{arch}.attention.key_length",
                              _field(reader, f"{arch}.rope.dimension_count", d_model // n_heads)))
        if _field(reader, f"{arch}.final_logit_softcapping", 0.0) or _field(reader,
                                                                             f"{arch}.attn_logit_softcapping", 0.0):
            raise ModelFileError(f"this {arch} file asks for logit softcapping, which minitransformer does not apply "
                                 "yet")
        tensor_names = {t.name for t in reader.tensors}
        biases = sorted(name[len("blk.0."):-len(".bias")] for name in tensor_names
                        if name.startswith("blk.0.") and name.endswith(".bias"))
        embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        if embd is None:
            raise ModelFileError("GGUF has no token_embd.weight tensor; not a llama-architecture model file")
        vocab = int(_field(reader, f"{arch}.vocab_size", int(embd.shape[-1])))
        window, sliding = sliding_layers(reader, arch, family, n_layers)
        scale_dim = d_model / n_heads if n_layers in family.query_scale_by_width else head_dim
        config = cls(
            name=str(_field(reader, "general.name", "unnamed")),
            family=arch,
            n_layers=n_layers,
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
            rope_pairing=family.rope_pairing,
            bias_tensors=tuple(biases),
            rope_freq_factors=rope_freq_factors(reader, arch, head_dim),
            qk_norm=family.qk_norm,
            sandwich_norms=family.sandwich_norms,
            activation=family.activation,
            embedding_scale=math.sqrt(d_model) if family.scale_embedding else 1.0,
            attention_scale=1.0 / math.sqrt(scale_dim) if family.query_scale_by_width else 0.0,
            sliding_window=window,
            sliding_layers=sliding,
            rope_base_local=float(_field(reader, f"{arch}.rope.freq_base_swa", family.rope_base_local))
            if sliding else 0.0,
        )
        value_dim = int(_field(reader, f"{arch}.attention.value_length", head_dim))
        if (family.heads_span_d_model and head_dim * n_heads != d_model) or value_dim != head_dim \
                or n_heads % n_kv_heads or head_dim % 2:
            raise ModelFileError(f"unsupported head layout: {n_heads} heads x head_dim {head_dim} (values "
                                 f"{value_dim}) vs d_model {d_model}, {n_kv_heads} KV heads (need keys and values "
                                 "of one size, n_heads divisible by n_kv_heads, even head_dim, and for "
                                 f"{arch} n_heads*head_dim == d_model)" if family.heads_span_d_model else
                                 f"unsupported head layout: {n_heads} heads x head_dim {head_dim} (values "
                                 f"{value_dim}), {n_kv_heads} KV heads (need keys and values of one size, n_heads "
                                 "divisible by n_kv_heads, even head_dim)")
        return config


def sliding_layers(reader, arch: str, family: Family, n_layers: int) -> tuple[int, tuple[int, ...]]:
    """(window, the layers that slide) from the file's attention.sliding_window and the family's period (or the
    file's attention.sliding_window_pattern); (0, ()) without sliding layers. A family without them refuses a file
    that has a window rather than run it with full attention."""
    window = int(_field(reader, f"{arch}.attention.sliding_window", 0))
    if not family.global_every:
        if window:
            raise ModelFileError(f"this {arch} file has sliding-window layers (attention.sliding_window); "
                                 f"minitransformer runs sliding windows only for "
                                 f"{', '.join(a for a, f in FAMILIES.items() if f.global_every)}")
        return 0, ()
    period = _field(reader, f"{arch}.attention.sliding_window_pattern", family.global_every)
    if not isinstance(period, int):
        raise ModelFileError(f"this {arch} file lists its sliding layers one by one "
                             "(attention.sliding_window_pattern as an array), which minitransformer does not read yet")
    sliding = tuple(i for i in range(n_layers) if window and i % period < period - 1)
    return (window if sliding else 0), sliding


def rope_freq_factors(reader, arch: str, head_dim: int) -> tuple[float, ...]:
    """Llama 3's RoPE frequency scaling, as llama.cpp's converter writes it, or () for plain RoPE; anything else the
    file asks of RoPE is refused rather than run with plain angles.

    HF's rope_type "llama3" (modeling_rope_utils._compute_llama3_parameters) divides the slow frequencies (a
    wavelength past original_max_position_embeddings / low_freq_factor) by `factor`, keeps the fast ones (past
    / high_freq_factor) and interpolates between. llama.cpp's converter (conversion/llama.py
    LlamaModel.generate_extra_tensors) turns that into one number per rotated pair, the tensor rope_freqs.weight
    (head_dim / 2 floats: 1, `factor`, or the interpolation), and llama.cpp's rope divides pair i's angle by it
    (ggml_rope_ext's freq_factors). The file holds the factors, not the rule, so this reads the tensor.
    """
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise ModelFileError(f"this {arch} file asks for RoPE scaling {scaling!r} (rope.scaling.type), which "
                             "minitransformer does not apply yet (it applies Llama 3's rope_freqs factors only)")
    rotated = int(_field(reader, f"{arch}.rope.dimension_count", head_dim))
    if rotated != head_dim:
        raise ModelFileError(f"this {arch} file rotates {rotated} of each head's {head_dim} dimensions "
                             "(rope.dimension_count): partial RoPE is not supported")
    tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if tensor is None:
        return ()
    factors = np.asarray(tensor.data, dtype=np.float64).reshape(-1)
    if tensor.tensor_type.name != "F32" or factors.size != head_dim // 2 or not (factors > 0).all():
        raise ModelFileError(f"rope_freqs.weight must be {head_dim // 2} positive F32 factors (one per rotated "
                             f"pair of head_dim {head_dim}); got {factors.size} of type {tensor.tensor_type.name}")
    return tuple(float(f) for f in factors)


_MISSING = object()


def _field(reader, key: str, default=_MISSING):
    """One metadata value (str, int, float, bool, or list) from a GGUFReader."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ModelFileError(f"GGUF metadata is missing {key!r}; not a complete llama-architecture model file")
        return default
    return field.contents()

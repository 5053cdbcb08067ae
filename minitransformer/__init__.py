"""minitransformer: a from-scratch, readable, real LLM inference engine (NumPy on the CPU, CuPy on a GPU).

    from minitransformer import load_model, generate, stream, SamplingParams
    model = load_model()                        # SmolLM2-135M-Instruct, fetched on first use
    out = generate(model, "The capital of France is", SamplingParams(max_tokens=16, temperature=0.0))
    for delta in stream(model, "Tell me a story", SamplingParams(max_tokens=64)): print(delta.text, end="")

See README.md for the map of the package and the lessons.
"""

from .core.config import ModelConfig
from .core.errors import DeviceError, InputError, MiniTransformerError, ModelFetchError, ModelFileError
from .core.generate import generate, stream
from .core.kv_cache import KVCache, estimate_kv_bytes
from .core.loading import load_model
from .core.model import Transformer
from .core.request import Delta, Request, Result
from .core.sampling import SamplingParams
from .core.tokenizer import Tokenizer, load_tokenizer

__all__ = ["load_model", "load_tokenizer", "generate", "stream", "SamplingParams", "Request", "Result", "Delta",
           "KVCache", "estimate_kv_bytes", "Transformer", "Tokenizer", "ModelConfig", "MiniTransformerError",
           "ModelFileError", "ModelFetchError", "InputError", "DeviceError"]
__version__ = "0.1.0"

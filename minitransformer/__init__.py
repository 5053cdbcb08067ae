"""minitransformer: a from-scratch, readable, real LLM inference engine (NumPy on the CPU, CuPy on a GPU).

    from minitransformer import load_model
    model = load_model()                        # SmolLM2-135M-Instruct, fetched on first use
    logits = model.forward(token_ids, positions)

See README.md for the map of the package and the lessons.
"""

from .config import ModelConfig
from .errors import DeviceError, InputError, MiniTransformerError, ModelFetchError, ModelFileError
from .model import Transformer, load_model
from .tokenizer import Tokenizer, load_tokenizer

__all__ = ["load_model", "load_tokenizer", "Transformer", "Tokenizer", "ModelConfig", "MiniTransformerError",
           "ModelFileError", "ModelFetchError", "InputError", "DeviceError"]
__version__ = "0.1.0"

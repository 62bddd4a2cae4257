"""LazyLLM: dynamic per-layer token pruning for long-context inference.

The engine only: no Optuna or MLflow imports here (those live in :mod:`tuner`).
"""

from lazyllm.apply import apply
from lazyllm.batch import BatchRequest, generate_batch
from lazyllm.engine import GenerationResult, GenerationTrace, LazyLLM, PrefillResult
from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.models import DEFAULT_MODEL, ModelLoadError, load_model
from lazyllm.sampling import Sampling
from lazyllm.schedule import Revival, Schedule, num_pruned
from lazyllm.streaming import TextStream

__all__ = [
    "DEFAULT_MODEL",
    "BatchRequest",
    "GenerationResult",
    "GenerationTrace",
    "LazyLLM",
    "ModelDims",
    "ModelLoadError",
    "PrefillResult",
    "Revival",
    "Sampling",
    "Schedule",
    "TextStream",
    "apply",
    "flop_speedup",
    "generate_batch",
    "load_model",
    "num_pruned",
]
__version__ = "0.1.0"

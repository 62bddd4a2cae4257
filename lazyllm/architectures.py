"""Which causal LMs the layer loop can drive, and the handles it needs on each.

The engine never forks modeling code: it calls the model's own embedding, decoder layers, final norm
and LM head. What differs between architectures is small and lives here:

* the Llama family (``llama``, ``mistral``, ``qwen2``, ``qwen3``) share one decoder-layer contract and
  one rotary embedding for all layers; Mistral slides a window on every layer, Qwen2/3 on the layers
  ``config.layer_types`` marks ``sliding_attention``;
* Gemma 3 (``gemma3_text``) computes rotary embeddings per layer type (local vs global base) and slides
  a window on its local layers; its LM head may soft-cap the logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

FULL = "full_attention"
SLIDING = "sliding_attention"

PositionEmbeddings = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class ArchFamily:
    """How to find the parts of one family of models.

    Args:
        name: family name for messages.
        rotary_per_layer_type: whether the rotary module takes the layer type as third argument.
    """

    name: str
    rotary_per_layer_type: bool


LLAMA_FAMILY = ArchFamily(name="llama-family", rotary_per_layer_type=False)
GEMMA3 = ArchFamily(name="gemma3", rotary_per_layer_type=True)

ARCHITECTURES: dict[str, ArchFamily] = {
    "llama": LLAMA_FAMILY,
    "mistral": LLAMA_FAMILY,
    "qwen2": LLAMA_FAMILY,
    "qwen3": LLAMA_FAMILY,
    "gemma3_text": GEMMA3,
}


@dataclass(frozen=True)
class DecoderStack:
    """Handles on a loaded causal LM, in the order the layer loop uses them.

    Shapes: ``embed(input_ids [B, N]) -> [B, N, hidden]``; each layer maps ``[B, n, hidden]`` to the
    same shape; ``logits(hidden [B, 1, hidden]) -> [B, vocab]``.
    """

    family: ArchFamily
    embed: nn.Module
    layers: nn.ModuleList
    norm: nn.Module
    lm_head: nn.Module
    rotary: nn.Module
    layer_types: tuple[str, ...]
    windows: tuple[int | None, ...]
    final_logit_softcapping: float | None

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def position_embeddings(
        self, hidden: torch.Tensor, position_ids: torch.Tensor
    ) -> dict[str, PositionEmbeddings]:
        """cos/sin for every layer type present; each ``[B, N, head_dim]``."""
        out: dict[str, PositionEmbeddings] = {}
        for layer_type in sorted(set(self.layer_types)):
            if self.family.rotary_per_layer_type:
                out[layer_type] = self.rotary(hidden, position_ids, layer_type)
            else:
                out[layer_type] = self.rotary(hidden, position_ids)
        return out

    def logits(self, hidden_last: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``[B, vocab]`` from the last hidden state ``[B, 1, hidden]``."""
        return self.logits_every(hidden_last[:, -1:])[:, -1]

    def logits_every(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``[B, q, vocab]`` after every position of ``hidden`` ``[B, q, hidden]``."""
        logits = self.lm_head(self.norm(hidden))
        if self.final_logit_softcapping is not None:
            cap = self.final_logit_softcapping
            logits = torch.tanh(logits / cap) * cap
        return logits


def supported_model_types() -> list[str]:
    return sorted(ARCHITECTURES)


def layer_windows(config: Any, num_layers: int) -> tuple[tuple[str, ...], tuple[int | None, ...]]:
    """Per-layer attention type and sliding window (``None`` = full causal attention)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        types = tuple(str(t) for t in layer_types)[:num_layers]
        unknown = set(types) - {FULL, SLIDING}
        if unknown:
            raise ValueError(f"layer types {sorted(unknown)} are not supported; supported: {FULL}, {SLIDING}")
    elif window is not None:  # Mistral: one window on every layer
        types = (SLIDING,) * num_layers
    else:
        types = (FULL,) * num_layers
    if SLIDING not in types:
        return types, (None,) * len(types)
    if not window:
        raise ValueError("config marks sliding-window layers but has no sliding_window size")
    size = int(window)
    return types, tuple(size if t == SLIDING else None for t in types)


def decoder_stack(model: Any) -> DecoderStack:
    """Find the parts of ``model`` (a ``*ForCausalLM``); unsupported architectures raise ``ValueError``."""
    config = model.config
    model_type = getattr(config, "model_type", None)
    family = ARCHITECTURES.get(model_type or "")
    if family is None:
        raise ValueError(
            f"model type {model_type!r} is not supported by LazyLLM; supported: {', '.join(supported_model_types())}"
        )
    core = getattr(model, "model", None)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if core is None or any(not hasattr(core, part) for part in needed) or not hasattr(model, "lm_head"):
        raise ValueError(
            f"{type(model).__name__} does not have the expected layout (model.{{{', '.join(needed)}}}, lm_head); "
            "load it with AutoModelForCausalLM"
        )
    num_layers = len(core.layers)
    types, windows = layer_windows(config, num_layers)
    return DecoderStack(
        family=family,
        embed=core.embed_tokens,
        layers=core.layers,
        norm=core.norm,
        lm_head=model.lm_head,
        rotary=core.rotary_emb,
        layer_types=types,
        windows=windows,
        final_logit_softcapping=getattr(config, "final_logit_softcapping", None),
    )

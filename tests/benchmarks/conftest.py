"""Fixtures of the benchmark smoke tests: a deeper tiny checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="session")
def deep_folder(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_folder``'s random Llama at 8 layers instead of 4 (same tokenizer and widths): deep enough
    for the schedules the benchmarks define on fractions of a 30-layer model (a progressive schedule of
    5 stages from a third of the depth)."""
    folder = tmp_path_factory.mktemp("tiny-smol-deep")
    config = LlamaConfig.from_pretrained(tiny_folder)
    config.num_hidden_layers = 8
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_folder).save_pretrained(folder)
    return folder

"""Fixtures of the benchmark smoke tests: a deeper tiny checkpoint, and one torch thread while a
benchmark runs in this process."""

from __future__ import annotations

from collections.abc import Iterator
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


@pytest.fixture
def one_thread() -> Iterator[None]:
    """One torch thread for the test, the process's count restored after it (a benchmark's ``--threads``
    sets it for the whole process). The smoke tests check what a script writes, not its speed: on a
    shared CPU, two threads of a tiny model's kernels spend their time waiting for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)

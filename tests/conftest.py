"""Shared fixtures: tiny random-init models (built once per session), the packaged models, a checkpoint folder."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig

from tests.support import ARCHS, make_tiny


def pytest_configure(config: pytest.Config) -> None:
    """A session started with Ctrl-C ignored (``nohup make test &``) passes SIG_IGN on to every
    subprocess, and the interrupt tests' real SIGINTs would meet deaf children that exit 0: restore
    Python's own handler, which a child's exec resets to the default."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _sigint_handler_restored() -> Any:
    """``cli_main`` ignores Ctrl-C once it has handled one (the command is ending): in-process calls
    must not leave the test session deaf to it."""
    before = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.fixture
def one_thread() -> Any:
    """One torch thread for the test, the process's count restored after it (a benchmark's ``--threads``
    sets it for the whole process). For tests that check what a tiny model's code writes, not its
    speed: on a shared CPU, two threads of a tiny model's kernels spend their time waiting for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(params=ARCHS)
def tiny(request: pytest.FixtureRequest) -> Any:
    return make_tiny(request.param)


@pytest.fixture(scope="session")
def smollm2() -> tuple[Any, Any]:
    from lazyllm.models import load_model

    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma3() -> tuple[Any, Any]:
    from lazyllm.models import load_model

    return load_model("gemma3-270m", device="cpu")


@pytest.fixture(scope="session")
def model_pair() -> Callable[[str], tuple[Any, Any]]:
    """``model_pair(arch)``: the same tiny model loaded twice, with sdpa and with eager attention.

    Built once per architecture and session; tests must not change their weights.
    """
    pairs: dict[str, tuple[Any, Any]] = {}

    def pair(arch: str) -> tuple[Any, Any]:
        if arch not in pairs:
            sdpa = make_tiny(arch, "sdpa")
            eager = make_tiny(arch, "eager")
            eager.load_state_dict(sdpa.state_dict())
            pairs[arch] = (sdpa, eager)
        return pairs[arch]

    return pair


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer random Llama with SmolLM2's tokenizer and chat template, saved as a checkpoint folder."""
    folder = tmp_path_factory.mktemp("tiny-smol")
    from transformers import AutoTokenizer, LlamaForCausalLM

    from lazyllm.models import prepare_packaged

    tokenizer = AutoTokenizer.from_pretrained(prepare_packaged("smollm2-135m"))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

from __future__ import annotations

import pytest
import torch

from lazyllm.baselines import static_pruning
from lazyllm.engine import LazyLLM
from lazyllm.models import ModelLoadError, load_model, model_name, parse_dtype, resolve
from lazyllm.schedule import Schedule
from tests.support import make_tiny


def test_resolve_errors(tmp_path) -> None:
    with pytest.raises(ValueError, match=r"unknown model 'nope'.*smollm2-135m"):
        resolve("nope")
    with pytest.raises(ValueError, match=r"has no config\.json"):
        resolve(str(tmp_path))
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        resolve(str(tmp_path / "f.bin"))
    assert resolve("meta-llama/Llama-2-7b-hf") == ("meta-llama/Llama-2-7b-hf", False)


def test_load_local_folder(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = make_tiny("llama")
    model.save_pretrained(tmp_path)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(97)} | {"[UNK]": 96}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(tmp_path)
    loaded, tokenizer = load_model(str(tmp_path), device="cpu")
    assert loaded.config.name_or_path == str(tmp_path)
    assert loaded.dtype == torch.float32 and not loaded.training
    ids = torch.tensor([tokenizer("w1 w2 w3")["input_ids"]])
    with torch.inference_mode():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    half, _ = load_model(str(tmp_path), device="cpu", dtype="bfloat16")  # by name, as settings spell it
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    with torch.inference_mode():  # the same model, rounded: close to float32, not equal
        torch.testing.assert_close(half(ids).logits.float(), model(ids).logits, atol=0.1, rtol=0.05)


def test_dtype_names_are_checked() -> None:
    assert parse_dtype("auto") is None and parse_dtype("float32") is torch.float32
    with pytest.raises(ValueError, match=r"dtype = 'fp8': must be one of auto, float32, bfloat16, float16"):
        parse_dtype("fp8")


def test_unreachable_hub_is_a_clear_error(monkeypatch) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no 45 s of network retries
    with pytest.raises(ModelLoadError, match="pass a local checkpoint folder"):
        load_model("lazyllm-tuner-test/does-not-exist", device="cpu")


def test_engine_imports_no_optuna_or_mlflow() -> None:
    import subprocess
    import sys

    code = "import sys, lazyllm, lazyllm.baselines, lazyllm.generate; print(sorted(m for m in ('optuna', 'mlflow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_one_model_name_helper_names_every_schedule() -> None:
    """lazyllm.models.model_name is the one rule: config.name_or_path, else the class name."""
    model = make_tiny("llama")
    layers = int(model.config.num_hidden_layers)
    model.config.name_or_path = ""
    assert model_name(model) == type(model).__name__
    assert static_pruning(model, 0.5).schedule.model == type(model).__name__  # a baseline uses it
    # the engine's strict name check reads the same name
    LazyLLM(model, Schedule.keep_all(type(model).__name__, layers), strict_model_name=True)
    model.config.name_or_path = "some/checkpoint"
    assert model_name(model) == "some/checkpoint" == static_pruning(model, 0.5).schedule.model
    with pytest.raises(ValueError, match="some/checkpoint"):
        LazyLLM(model, Schedule.keep_all(type(model).__name__, layers), strict_model_name=True)

"""benchmarks/random_checkpoint.py: a folder ``load_model`` reads like any checkpoint, with ``--like``'s
config and tokenizer and the ``--set`` overrides; a field the config lacks is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lazyllm.models import load_model
from tests.support import load_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_random_checkpoint_of_the_same_shape_loads(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_benchmark("random_checkpoint")
    out = tmp_path / "random"
    argv = ["--like", str(tiny_folder), "--out", str(out), "--set", "num_hidden_layers=2",
            "--set", "hidden_act=\"silu\"", "--dtype", "float32", "--seed", "1"]  # fmt: skip
    assert bench.main(argv) == 0
    assert "random LlamaForCausalLM" in capsys.readouterr().out
    model, tokenizer = load_model(str(out), device="cpu")
    like, _ = load_model(str(tiny_folder), device="cpu")
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == like.config.hidden_size
    assert next(model.parameters()).dtype == torch.float32
    assert (
        tokenizer("Paris")["input_ids"]
        == bench.AutoTokenizer.from_pretrained(tiny_folder)("Paris")["input_ids"]
    )
    weight = model.model.embed_tokens.weight
    assert not torch.equal(weight, like.model.embed_tokens.weight[: weight.shape[0]])  # weights of its own

    with pytest.raises(SystemExit, match="not fields of LlamaConfig"):
        bench.main(["--like", str(tiny_folder), "--out", str(tmp_path / "bad"), "--set", "n_layerz=2"])
    with pytest.raises(SystemExit, match=r"no config\.json"):
        bench.main(["--like", str(tmp_path), "--out", str(tmp_path / "bad")])
    assert bench.parse_override("rope_theta=1e4") == ("rope_theta", 1e4)
    assert bench.parse_override("name=text") == ("name", "text")

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lazyllm.generate import main
from lazyllm.schedule import Schedule


def test_cli_reports_policy_and_decode_speed(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    schedule = Schedule.from_layers("tiny", 4, {1: 50}).save(tmp_path / "s.json")
    args = ["--model", str(tiny_folder), "--schedule", str(schedule), "--allow-other-model"]
    args += ["--prompt", "a b c d e f g h", "--no-chat", "--max-new-tokens", "3"]
    assert main([*args, "--revival", "budget:2", "--compare"]) == 0
    out = capsys.readouterr().out
    assert out.count("revival budget:2") == 1 and "revival frozen" in out  # the unpruned run: keep-all
    assert "decode " in out and "ms/token" in out and "total speedup" in out
    assert main([*args, "--revival", "sometimes"]) == 2
    assert "revival policy = 'sometimes'" in capsys.readouterr().err


def test_cli_samples_with_a_seed_and_streams(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--do-sample/--seed mean what generate's keywords mean; --stream prints the same answer."""
    from lazyllm.engine import LazyLLM
    from lazyllm.models import load_model

    schedule = Schedule.from_layers("tiny", 4, {1: 50}).with_revival("frozen")
    path = schedule.save(tmp_path / "s.json")
    args = ["--model", str(tiny_folder), "--schedule", str(path), "--allow-other-model", "--no-chat"]
    args += ["--prompt", "a b c d e f g h", "--max-new-tokens", "6", "--do-sample", "--temperature", "1.2"]
    args += ["--top-k", "40", "--top-p", "0.9", "--seed", "5"]
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    expected = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False).generate(
        "a b c d e f g h",
        max_new_tokens=6,
        chat=False,
        do_sample=True,
        temperature=1.2,
        top_k=40,
        top_p=0.9,
        seed=5,
    )
    assert main(args) == 0
    blocking = capsys.readouterr().out
    assert main([*args, "--stream"]) == 0
    streamed = capsys.readouterr().out
    for out in (blocking, streamed):
        assert out.startswith(f"--- LazyLLM ---\n{expected.text}\nTTFT ")
        assert "sampled" in out and "TTFT" in out
    assert main([*args, "--top-p", "1.5"]) == 2
    assert "top_p = 1.5: must be in (0, 1]" in capsys.readouterr().err


def test_the_chat_template_default_is_one_rule_in_python_and_the_cli(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A text prompt is the user turn of the chat template whenever the tokenizer has one: the Python
    default, the CLI's default and chat=True agree; --no-chat and chat=False give the raw text."""
    from lazyllm.engine import LazyLLM
    from lazyllm.models import load_model

    schedule = Schedule.from_layers("tiny", 4, {1: 50})
    path = schedule.save(tmp_path / "s.json")
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    assert tokenizer.chat_template  # SmolLM2's, so the default must apply it
    llm = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)
    text = "Name a colour."
    default, templated, raw = (
        llm.generate(text, max_new_tokens=4, eos_token_id=[], **chat)
        for chat in ({}, {"chat": True}, {"chat": False})
    )
    assert default.token_ids == templated.token_ids and default.prompt_tokens == templated.prompt_tokens
    assert raw.prompt_tokens < default.prompt_tokens  # the template's turn markers are not in the raw text
    args = ["--model", str(tiny_folder), "--schedule", str(path), "--allow-other-model", "--prompt", text]
    args += ["--max-new-tokens", "4", "--device", "cpu"]
    assert main(args) == 0
    assert f"prompt {default.prompt_tokens} tokens" in capsys.readouterr().out
    assert main([*args, "--no-chat"]) == 0
    assert f"prompt {raw.prompt_tokens} tokens" in capsys.readouterr().out

    # a tokenizer without a template (a base model): the default is the raw text, not an error
    tokenizer.chat_template = None
    assert llm.generate(text, max_new_tokens=4, eos_token_id=[]).token_ids == raw.token_ids


def test_cli_runs_on_the_device_and_dtype_asked(
    tiny_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lazyllm.engine import LazyLLM
    from lazyllm.models import load_model

    schedule = Schedule.from_layers("tiny", 4, {1: 50})
    path = schedule.save(tmp_path / "s.json")
    args = ["--model", str(tiny_folder), "--schedule", str(path), "--allow-other-model", "--no-chat"]
    args += ["--prompt", "a b c d e f g h", "--max-new-tokens", "5", "--device", "cpu"]
    model, tokenizer = load_model(str(tiny_folder), device="cpu", dtype="bfloat16")
    expected = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False).generate(
        "a b c d e f g h", max_new_tokens=5, chat=False
    )
    assert main([*args, "--dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"--- LazyLLM ---\n{expected.text}\nTTFT ") and out.endswith("on cpu, bfloat16\n")
    assert main(args) == 0  # auto: float32 on a CPU
    assert capsys.readouterr().out.endswith("on cpu, float32\n")
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal
        main([*args, "--dtype", "float64"])
    assert exit_.value.code == 2 and "invalid choice: 'float64'" in capsys.readouterr().err
    assert main([*args, "--device", "tpu:0"]) == 2
    assert "--device tpu:0: unknown" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main([*args, "--device", "cuda"]) == 2
        assert "--device cuda: this machine has no CUDA device; give --device cpu" in capsys.readouterr().err

"""The GPU path, dry-run on the CPU: ``--preset qa-gpu --model <folder>`` end to end on local parquet files
in the hub's layout, and the README's cost line checked against the formula (tuner/study/cost.py).

What differs from a GPU run, each said by a flag: ``--n-trials 3`` (the preset's 100 trials of 30
prefills at 3500 tokens are minutes of a tiny model on 2 cores), ``--heldout-n-examples 1`` (the
held-out check's 30 test examples a dataset, two answers each of up to 128 tokens, take minutes too),
``--max-new-tokens 8`` (LongBench's own answer lengths, up to 128 tokens, are what a random-init model
always generates in full: most of the run's time), ``--dtype bfloat16`` (what ``auto`` gives on CUDA;
on a CPU it would be float32), ``--output``. The model is a tiny random-init Qwen2 (and
Llama) with SmolLM2's tokenizer and chat template, saved as a checkpoint folder; LongBench's six English
QA datasets are written as ``<dataset>/test/0000.parquet`` (the hub mirror's columns and layout) and
read through ``datasets`` as the hub path reads them, with LongBench's prompt tables from a ``file://``
URL; the fresh-drift check reads the packaged pool.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from tuner.data.embedded import longbench_folder
from tuner.data.longbench import MAXLEN_FILE, PROMPT_FILE, longbench_specs
from tuner.study.cost import expected_counts, study_cost
from tuner.study.settings import resolve_settings

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
COST_DOC = ROOT / "docs" / "benchmarks.md"
PREFILL_SECONDS = 0.12
"""The H200 prefill at Llama-3.1-8B's shape, 4096 tokens (docs/benchmarks.md#prefill-speed): what the
README's minutes are computed at."""
CPU_FLAGS = ["--n-trials", "3", "--heldout-n-examples", "1", "--max-new-tokens", "8", "--dtype", "bfloat16"]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_readme_cost_line_is_the_formula() -> None:
    settings = resolve_settings("qa-gpu", {})
    cost = study_cost(settings, *expected_counts(settings))
    line = next(x for x in README.read_text().splitlines() if "prefills a trial" in x)
    found = re.search(
        r"\*\*(\d+) prefills a trial\*\* \((\d+) validation prompts \+ (\d+) timing rounds of 2\), "
        r"([\d,]+) for (\d+) trials: about ([\d.]+) minutes at ([\d.]+) s a prefill",
        line,
    )
    assert found, line
    trial, prompts, rounds, total, trials, minutes, seconds = map(_number, found.groups())
    assert (trial, prompts, rounds) == (cost.trial_prefills, cost.search_prompts, settings.timing_rounds)
    assert (total, trials) == (cost.prefills, settings.n_trials) and seconds == PREFILL_SECONDS
    assert minutes == round(cost.trial_minutes(PREFILL_SECONDS), 1)
    answers = re.search(r"then about ([\d,]+) answers", line)
    assert answers and _number(answers[1]) == round(cost.answers, -2), line
    assert "docs/benchmarks.md#what-a-study-costs" in line
    assert "## What a study costs" in COST_DOC.read_text()


def _tiny_folder(arch: str, folder: Path) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from lazyllm.models import prepare_packaged

    tokenizer = AutoTokenizer.from_pretrained(prepare_packaged("smollm2-135m"))
    torch.manual_seed(0)
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    model = (
        Qwen2ForCausalLM(Qwen2Config(**common))
        if arch == "qwen2"
        else LlamaForCausalLM(LlamaConfig(**common))
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _hub_layout(root: Path) -> tuple[str, str]:
    """LongBench's English QA datasets as the hub mirror lays them out, and its prompt tables' URL."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = longbench_folder()
    columns = ["input", "context", "answers", "length", "dataset", "language", "all_classes", "_id"]
    for spec in longbench_specs("qa", "en"):
        lines = (source / f"{spec.name}.jsonl").read_text(encoding="utf-8").splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        (root / spec.name / "test").mkdir(parents=True)
        pq.write_table(
            pa.table({c: [r.get(c) for r in rows] for c in columns}),
            root / spec.name / "test" / "0000.parquet",
        )
    config = root / "config"
    config.mkdir()
    for name in (PROMPT_FILE, MAXLEN_FILE):
        (config / name).write_bytes((source / name).read_bytes())
    return str(root / "{dataset}" / "test" / "0000.parquet"), config.as_uri()


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_qa_gpu_preset_runs_end_to_end(arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from lazyllm import Schedule
    from tuner.search import main

    model = _tiny_folder(arch, tmp_path / f"tiny-{arch}")
    parquet, config = _hub_layout(tmp_path / "hub")
    monkeypatch.setenv("LONGBENCH_HUB_PARQUET", parquet)
    monkeypatch.setenv("LONGBENCH_CONFIG_URL", config)
    monkeypatch.setenv("LONGBENCH_DIR", "/nonexistent")  # the preset's data_dir: hub wins over it
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("LAZYLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("OPENQA_DIR", raising=False)
    out = tmp_path / "runs"
    argv = ["--preset", "qa-gpu", "--model", str(model), *CPU_FLAGS, "--output", str(out)]
    assert main(argv) == 0

    (study,) = [p for p in out.iterdir() if p.is_dir()]
    settings = resolve_settings("qa-gpu", {"model": str(model)})
    assert (settings.max_prompt_tokens, settings.speedup, settings.max_accuracy_loss) == (
        3500,
        "measured",
        1.0,
    )
    recommended = study / "recommended.json"
    assert recommended.is_file(), sorted(p.name for p in study.iterdir())
    schedule = Schedule.load(recommended)
    assert schedule.num_layers == 4
    pick = json.loads(recommended.read_text())
    assert pick["format"] == "lazyllm-schedule"

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{study / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lazyllm-tuner")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("lazyllm.role") == "study"]
    assert parent.info.status == "FINISHED"
    params = parent.data.params
    assert params["speedup_kind"] == "measured" and params["max_prompt_tokens"] == "3500"
    assert params["dtype"] == "bfloat16" and params["max_accuracy_loss"] == "1.0"
    assert parent.data.tags["lazyllm.end_reason"].startswith("done: 3 of 3 trials")
    children = [r for r in runs if r.data.tags.get("lazyllm.role") == "trial"]
    assert len(children) == 3 and all("speedup" in r.data.metrics for r in children)

"""Issue 32: a cache that still parses is not trusted for that; it proves itself (checksum, inputs,
plausible values) or is rebuilt with one line, and the rebuilt one gives what a clean run gives."""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from lazyllm.engine import LazyLLM
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tests.support import longbench_dir
from tuner.evaluation.fidelity import FidelityEvaluator
from tuner.evaluation.integrity import json_digest, tensors_digest
from tuner.evaluation.runner import BASELINE_FORMAT, BaselineEntry, Evaluator, load_baseline
from tuner.study.settings import EvalSettings


def _config(folder: Path) -> EvalSettings:
    return EvalSettings(
        model=str(folder), task="hotpotqa,trec", n_examples=1, max_prompt_tokens=96, max_new_tokens=3,
        data_dir=longbench_dir(),
    )  # fmt: skip


@pytest.fixture(scope="module")
def clean(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One clean run: the cache folder, the baseline and the pruned model's drift."""
    model, tokenizer = load_model(str(tiny_folder))
    cache = tmp_path_factory.mktemp("clean-cache")
    ev = Evaluator(model, tokenizer, _config(tiny_folder), cache, progress=False)
    fid = FidelityEvaluator(ev, top_k=4, gold=True)
    pruned = LazyLLM(model, Schedule.from_layers("x", 4, {0: 60}), strict_model_name=False)
    drifts, _ = fid.evaluate(pruned)
    return {"model": model, "tokenizer": tokenizer, "cache": cache, "drifts": drifts, "pruned": pruned,
            "config": _config(tiny_folder),
            "baseline": ev.baseline(), "files": (ev.cache.path.name, fid.cache.path.name)}  # fmt: skip


def _tensor_span(path: Path, name: str) -> tuple[int, int]:
    """Byte offsets of tensor ``name``'s data in a safetensors file (after its header)."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    begin, end = json.loads(data[8 : 8 + n])[name]["data_offsets"]
    return 8 + n + begin, 8 + n + end


def _resave(path: Path, change: Callable[[dict[str, torch.Tensor]], object], checksum: bool = True) -> None:
    """Rewrite a fidelity cache with ``change`` applied and a *consistent* checksum (a forgery only
    the identity or plausibility checks can catch), or none at all (an older version's file)."""
    with safe_open(str(path), framework="pt") as f:
        metadata = dict(f.metadata())
    tensors = load_file(str(path))
    change(tensors)
    metadata["checksum"] = tensors_digest(tensors)
    if not checksum:
        del metadata["checksum"]
    save_file(tensors, str(path), metadata=metadata)


def _overwrite_logp(path: Path) -> None:
    """1 KB (or the whole tensor) of a ``topk_logp`` overwritten, header kept: still parses."""
    name = next(k for k in load_file(str(path)) if k.endswith("::topk_logp"))
    begin, end = _tensor_span(path, name)
    data = bytearray(path.read_bytes())
    size = min(1024, end - begin)
    data[begin : begin + size] = struct.pack("<f", -0.5) * (size // 4)  # plausible values, wrong ones
    path.write_bytes(bytes(data))


def _first(tensors: dict[str, torch.Tensor], field: str) -> str:
    return next(k for k in sorted(tensors) if k.endswith(f"::{field}"))


def _edit_baseline(path: Path, change: Callable[[dict[str, Any]], None], checksum: str = "keep") -> None:
    data = json.loads(path.read_text())
    change(data)
    if checksum == "recompute":
        data["checksum"] = json_digest(
            {"format": data["format"], "fingerprint": data["fingerprint"], "entries": data["entries"]}
        )
    elif checksum == "drop":
        del data["checksum"], data["format"], data["fingerprint"]  # what v1 wrote
    path.write_text(json.dumps(data))


def _one_entry(data: dict[str, Any]) -> dict[str, Any]:
    return next(iter(data["entries"].values()))


def _set(entry_field: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda data: _one_entry(data).__setitem__(entry_field, value)


def _fid(change: Callable[[dict[str, torch.Tensor]], object], checksum: bool = True) -> Any:
    return lambda fid_path, base_path: _resave(fid_path, change, checksum)


CORRUPTIONS: dict[str, tuple[str, Callable[[Path, Path], None], str]] = {
    # fidelity: the 1 KB overwrite, an older file, a forged answer, an implausible log-prob
    "fidelity bytes": ("fidelity", lambda f, b: _overwrite_logp(f), "checksum does not match"),
    "fidelity v2 without checksum": ("fidelity", _fid(lambda t: None, checksum=False), "without a checksum"),
    "fidelity answer forged": (
        "fidelity", _fid(lambda t: t[_first(t, "answer_ids")].add_(1)), "not forced along the current baseline"
    ),
    "fidelity log-prob > 0": (
        "fidelity", _fid(lambda t: t[_first(t, "topk_logp")].fill_(0.5)), "must be float32 and <= 0"
    ),
    # baseline: the score edit, an older file, a forged score, a score outside [0, 1]
    "baseline score edited": ("baseline", lambda f, b: _edit_baseline(b, _set("score", 0.25)), "checksum does not match"),
    "baseline v1": ("baseline", lambda f, b: _edit_baseline(b, lambda d: None, "drop"), "without a checksum"),
    "baseline score 100": (
        "baseline", lambda f, b: _edit_baseline(b, _set("score", 100.0), "recompute"), "score = 100.0"
    ),
    "baseline token ids": (
        "baseline", lambda f, b: _edit_baseline(b, _set("new_tokens", 99), "recompute"), "new_tokens = 99"
    ),
    "baseline other inputs": (
        "baseline",
        lambda f, b: _edit_baseline(b, lambda d: d["fingerprint"].__setitem__("split", "test"), "recompute"),
        "made for other inputs",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupt_cache_is_rebuilt_and_gives_the_clean_answer(
    clean: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    which, corrupt, reason = CORRUPTIONS[case]
    cache = tmp_path / "cache"
    shutil.copytree(clean["cache"], cache)
    base_name, fid_name = clean["files"]
    corrupt(cache / fid_name, cache / base_name)
    capsys.readouterr()
    ev = Evaluator(clean["model"], clean["tokenizer"], clean["config"], cache, progress=False)
    fid = FidelityEvaluator(ev, top_k=4, gold=True)
    drifts, _ = fid.evaluate(clean["pruned"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "is not trusted" in line]
    assert (
        len(lines) == 1
        and reason in lines[0]
        and (fid_name if which == "fidelity" else base_name) in lines[0]
    )
    assert [(d.kl, d.top1, d.gold_delta) for d in drifts] == [
        (d.kl, d.top1, d.gold_delta) for d in clean["drifts"]
    ]
    key = lambda e: (e.prediction, e.score, e.token_ids)  # noqa: E731
    assert {k: key(e) for k, e in ev.baseline().items()} == {k: key(e) for k, e in clean["baseline"].items()}
    # the rebuilt files prove themselves: a third evaluator trusts both and says nothing
    assert load_baseline(cache / base_name, ev.cache.fingerprint).problem is None
    again = FidelityEvaluator(
        Evaluator(clean["model"], clean["tokenizer"], ev.config, cache, progress=False), top_k=4, gold=True
    )
    assert set(again.cache.entries) == set(fid.cache.entries)
    assert "is not trusted" not in capsys.readouterr().out  # fmt: skip


def test_baseline_entry_round_trips_and_refuses_implausible_values() -> None:
    entry = BaselineEntry("Paris", 1.0, 0.1, 0.2, (5, 6))
    assert BaselineEntry.from_dict(entry.to_dict()) == entry and entry.new_tokens == 2
    cases: list[tuple[dict[str, Any], str]] = [
        ({"score": 1.5}, "score = 1.5"),
        ({"score": float("nan")}, "score = nan"),
        ({"ttft_s": -1.0}, "ttft_s = -1.0"),
        ({"score": "1"}, "not a number"),
        ({"token_ids": [1, -2], "new_tokens": 2}, "token_ids"),
    ]
    for bad, fragment in cases:
        with pytest.raises(ValueError, match=fragment):
            BaselineEntry.from_dict({**entry.to_dict(), **bad})
    with pytest.raises(ValueError, match="no answer token ids"):  # an entry from before ids were cached
        BaselineEntry.from_dict(
            {"prediction": "x", "score": 0.0, "ttft_s": 0.1, "total_s": 0.1, "new_tokens": 1}
        )


def test_an_older_baseline_file_is_migrated_but_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "baseline-x.json"
    entry = BaselineEntry("Paris", 1.0, 0.1, 0.2, (5, 6))
    path.write_text(json.dumps({"entries": {"k": entry.to_dict()}}))  # v1: no format, checksum or fingerprint
    found = load_baseline(path, {"model": "m"})
    assert found.entries == {"k": entry} and found.problem is not None and "older version" in found.problem
    assert BASELINE_FORMAT.endswith("v2")

"""Helpers shared by the tests: tiny random-init models of each supported architecture, prompts,
transformers' own greedy decoding, and the LongBench folder. Fixtures built on them live in conftest.py."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
)

torch.set_num_threads(min(2, os.cpu_count() or 1))

_COMMON: dict[str, Any] = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=5,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
)


def _configs() -> dict[str, Callable[[], Any]]:
    return {
        "llama": lambda: LlamaConfig(**_COMMON),
        # every layer slides a window of 8, so prompts of 20+ tokens exercise the masks
        "mistral": lambda: MistralConfig(**_COMMON, sliding_window=8),
        # two full layers then three sliding ones
        "qwen2": lambda: Qwen2Config(
            **_COMMON, use_sliding_window=True, sliding_window=8, max_window_layers=2
        ),
        # Gemma 3: local/global rotary per layer type, sliding layers, q/k norms, scaled embeddings
        "gemma3": lambda: Gemma3TextConfig(
            **{**_COMMON, "num_hidden_layers": 6}, head_dim=16, sliding_window=8
        ),
    }


ARCHS = sorted(_configs())


def make_tiny(arch: str, attn_implementation: str = "sdpa", seed: int = 0) -> Any:
    """A random-init tiny causal LM (fp32, eval mode); its name is ``tiny-<arch>``."""
    torch.manual_seed(seed)
    config = _configs()[arch]()
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation=attn_implementation, dtype=torch.float32
    )
    # random init gives near-uniform attention; larger weights make importance scores distinct
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "proj" in name:
                param.mul_(3.0)
    model.eval()
    model.config.name_or_path = f"tiny-{arch}"
    return model


def prompt(n: int, seed: int = 0, vocab: int = 97) -> torch.Tensor:
    """A seeded random prompt of ``n`` token ids, shape [1, n]."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, n), generator=g)


def hf_greedy(model: Any, ids: torch.Tensor, n: int, **kwargs: Any) -> Any:
    """transformers' own greedy decoding of exactly ``n`` tokens, with per-step logits."""
    with torch.inference_mode():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )


def longbench_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.environ.get("LONGBENCH_DIR") or os.path.join(here, "..", "..", "shared", "data", "longbench")


def n_warm_starts(num_layers: int = 4) -> int:
    """How many warm starts the packaged ``stages`` space queues for a ``num_layers``-layer model (the
    tiny test checkpoint has 4), keep-all's reference trial included: a study of that many trials runs
    them all and leaves none waiting."""
    from tuner.study.spaces import load_space

    return 1 + len(load_space("stages").warm_start(num_layers))


def assert_evaluated_once(trials: list[Any]) -> None:
    """No schedule was evaluated twice when it could have been known: a finished trial whose schedule
    an earlier one already had must have started before that trial finished (workers racing on the
    same schedule cannot know); a later proposal of it is refused and never evaluated."""
    from tuner.study.records import TrialRecord, schedule_key

    first: dict[str, Any] = {}
    for t in sorted(trials, key=lambda t: t.number):
        record = TrialRecord.from_trial(t)
        assert record is not None, t.number
        key = schedule_key(record.schedule)
        if key not in first:
            first[key] = t
            continue
        assert t.datetime_start < first[key].datetime_complete, (t.number, first[key].number)


_RECORDERS: list[tuple[str, list[tuple[Any, ...]]]] = []


def _record_audit(event: str, args: tuple[Any, ...]) -> None:
    for wanted, seen in _RECORDERS:
        if event == wanted:
            seen.append(args)


_HOOKED: list[bool] = []  # audit hooks cannot be removed: one per process, added at first use


@contextmanager
def audited(event: str) -> Iterator[list[tuple[Any, ...]]]:
    """The arguments of every ``event`` (a :func:`sys.audit` event: ``"open"`` gives ``(path, mode,
    flags)``, ``"socket.connect"`` gives ``(socket, address)``) raised in this process inside the block:
    what the code really did (files opened, connections tried), counted without replacing any of it."""
    if not _HOOKED:
        sys.addaudithook(_record_audit)  # silent outside a block
        _HOOKED.append(True)
    entry: tuple[str, list[tuple[Any, ...]]] = (event, [])
    _RECORDERS.append(entry)
    try:
        yield entry[1]
    finally:
        _RECORDERS.remove(entry)


@contextmanager
def database_connects() -> Iterator[list[tuple[str, Any, Any]]]:
    """``(dialect, host, port)`` of every connection SQLAlchemy tried to open in this process inside the
    block, whether it succeeded or not (its ``do_connect`` event, on every engine): counted without
    replacing anything. A driver such as libpq connects in C, out of sight of :func:`audited`."""
    import sqlalchemy
    from sqlalchemy import event

    tried: list[tuple[str, Any, Any]] = []

    def record(dialect: Any, conn_rec: Any, cargs: Any, cparams: dict[str, Any]) -> None:
        tried.append((dialect.name, cparams.get("host"), cparams.get("port")))

    event.listen(sqlalchemy.engine.Engine, "do_connect", record)
    try:
        yield tried
    finally:
        event.remove(sqlalchemy.engine.Engine, "do_connect", record)


def wait_for_http(url: str, proc: Any, log: Path, *, what: str, timeout: float = 120) -> None:
    """Poll ``url`` until it answers 200; fail with the server's log if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start: {log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)


def stop_process_group(proc: Any) -> None:
    """Stop a server started with ``start_new_session=True`` and every worker it forked."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def hand_record(
    number: int,
    speedup: float,
    loss: float,
    percentiles: tuple[float, ...],
    *,
    upper: float | None = None,
    accuracy: str = "fidelity",
    revival: str = "frozen",
) -> Any:
    """A complete :class:`~tuner.study.records.TrialRecord` built by hand (4-layer model ``tiny``)."""
    from lazyllm.schedule import Schedule
    from tuner.statistics.bootstrap import Estimate
    from tuner.study.records import TrialRecord

    upper = loss + 0.01 if upper is None else upper
    est = Estimate(value=loss, se=0.01, low=loss - 0.02, high=upper, upper=upper, level=0.9, n=4)
    return TrialRecord(
        number=number, schedule=Schedule("tiny", percentiles).with_revival(revival), params={"i": number},
        accuracy=accuracy, flop_speedup=speedup, prompt_computed_pct=100.0 / speedup, examples_run=4,
        loss=est, speedup=speedup,
    )  # fmt: skip


def decision_outcome(
    next_upper: float, slope: float, slope_upper: float, max_scored: float, at_90: float | None = None
) -> Any:
    """A :class:`~tuner.stages.outcome.StudyOutcome` for the decision: trial 1 (1.4x, KL 0.1)
    recommended; trial 2 (1.8x, KL 0.3, bound ``next_upper``) the next step up; a pooled calibration
    (``slope``, ``slope_upper`` at 0.6, largest scored KL ``max_scored``, 13 examples, budget 2 points);
    ``at_90``: the slope's bound at --confidence 0.9 (None: a calibration stored before it was recorded)."""
    from tuner.evaluation.losses import Budget, FidelityLoss, ScoreLoss
    from tuner.stages.confirm import CandidateResult, Confirmation
    from tuner.stages.outcome import StudyOutcome
    from tuner.statistics.bootstrap import Estimate
    from tuner.statistics.calibration import Calibration
    from tuner.study.identity import StudyIdentity

    identity = {
        "model": "tiny",
        "task": "qa",
        "search_space": "stages",
        "speedup": "flops",
        "n_examples": None,
    }
    records = (
        hand_record(0, 1.0, 0.0, (0.0, 0.0, 0.0, 0.0)),
        hand_record(1, 1.4, 0.1, (0.0, 30.0, 0.0, 0.0)),
        hand_record(2, 1.8, 0.3, (0.0, 60.0, 0.0, 0.0), upper=next_upper),
    )
    cal = Calibration(
        slope, slope_upper, 0.6, 13, (1,), max_scored, ((1, 0.1, slope * 0.1),),
        None if at_90 is None else 0.9, at_90,
    )  # fmt: skip
    est = Estimate(value=0.5, se=1.0, low=-1.0, high=2.0, upper=1.5, level=0.9, n=13)
    rec = CandidateResult(1, (0.0, 30.0, 0.0, 0.0), 1.4, 0.1, "confirmed", est, "why")
    conf = Confirmation(2.0, 0.9, (rec,), 13, 3, "pooled", cal)
    budget = Budget(FidelityLoss(0.6), ScoreLoss(2.0))
    return StudyOutcome("s", StudyIdentity.from_dict(identity), budget, records, conf)


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as module ``<name>_bench`` (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_bench", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(module: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``python -m module args --host 127.0.0.1 --port P`` as a real server subprocess, until the block
    ends; yields its base URL once ``/health`` answers (the server's log is in ``log``)."""
    port = free_port()
    cmd = [sys.executable, "-m", module, *args, "--host", "127.0.0.1", "--port", str(port)]
    root = str(Path(__file__).resolve().parents[1])
    environ = {**os.environ, "PYTHONPATH": root, **(env or {})}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=environ, cwd=root, start_new_session=True
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for_http(base + "/health", proc, log, what=module)
            yield base
        finally:
            stop_process_group(proc)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None

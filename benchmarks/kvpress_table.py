"""One table, one run: the tuned pick, paper-style, the peers and NVIDIA kvpress's presses on the same
open-QA test prompts at 2048 tokens.

    make kvpress-setup        # once: .venv-kvpress with kvpress 0.5.5 (it pins transformers<5.3)
    .venv/bin/python benchmarks/kvpress_table.py --openqa-dir ../shared/data/open-qa [--n 300]

Examples: the open-QA task's test split as the open-QA preset (``studies/openqa.yaml``) builds it
(SmolLM2, bfloat16, prompts of 2048 tokens, answers of at most 32 tokens, greedy, the tuner's stop
rules), ``--n`` of them alternating HotpotQA and SQuAD; every method gets the same prompt token ids.

Rows (:func:`plan`): the unpruned model; the tuned pick (``--pick``, default the open-QA preset's, FastKV's
rule with 20% dropped after layers 8, 15 and 22); paper-style (:meth:`lazyllm.Schedule.paper_style`);
GemFilter and TSP (:mod:`lazyllm.peers`) at their published settings and at the pick's FLOP speedup
(:func:`lazyllm.peers.match_speedup` at the median prompt length); every LazyLLM-side schedule with
``frozen`` revival (what the study tunes). kvpress's SnapKVPress, ExpectedAttentionPress and TOVAPress
at the KV memory the pick keeps (``compression_ratio`` = 1 - the pick's kept share of (token, layer)
pairs at the median length) and at 50% (``--press-ratios`` sets which), plus ``unpruned (kvpress
venv)``, the control: the same route without a press, in kvpress's venv. kvpress runs in
``.venv-kvpress`` (:mod:`kvpress_worker`, a subprocess).

kvpress compresses a *context* and then reads a *question* uncompressed (its pipeline's convention):
each prompt is split (:func:`split_prompt`) at the last ``Question:`` of the template, so the question,
the ``Answer:`` prefix and the chat template's tail are the question; the same split for every kvpress
row. LazyLLM and the peers prune the whole prompt, question included.

Columns: measured TTFT speedup against each side's own unpruned prefill, on the example of median
prompt length (:mod:`tuner.statistics.speed`: interleaved rounds, minimum per side, the CPU thread clock
on a CPU; kvpress: prefill with compression, then the question, against one unpruned prefill of the same
ids in its venv); FLOP speedup (:mod:`lazyllm.flops`; a press does the whole prefill: 1.0x); KV-cache
bytes kept after the prefill (LazyLLM-side: per layer the tokens it computed, :func:`kv_tokens`; kvpress:
what its cache holds) and their share of the unpruned model's; task loss against the unpruned model in
score points with the 90% paired bootstrap interval (:func:`tuner.evaluation.runner.loss_estimate`),
and each method's loss against the tuned pick itself, paired on the examples both have (a positive
value: the method loses more than the pick); teacher-forced KL to the unpruned model along its
answer (:mod:`tuner.evaluation.fidelity`; kvpress's against its own venv's unpruned model),
macro-averaged over the datasets as the tuner averages it.

Resumable: each (method, example) is one JSON line of ``--out`` as soon as it is done (speed rows
once per method), a rerun skips what is there (a truncated last line is cut off), and the table
(``--table``, markdown) is written from the rows, so a partial run gives a table whose rows carry
their own n.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.flops import ModelDims
from lazyllm.methods import METHODS, make_method
from lazyllm.models import resolve
from lazyllm.peers import match_speedup
from lazyllm.peers.gemfilter import GemFilter
from lazyllm.text import StopCriteria
from tuner.evaluation.fidelity import ExampleDrift, FidelityEvaluator, drift
from tuner.evaluation.recorder import read_rows
from tuner.evaluation.runner import (
    Evaluator,
    Example,
    ExampleResult,
    loss_estimate,
    run_examples,
    score_prediction,
)
from tuner.report.figure import pyplot
from tuner.stages.confirm import kl_so_far
from tuner.statistics.bootstrap import Estimate, macro_weights
from tuner.statistics.speed import SpeedMeasurement, measure_speedup, prefill_timer, resolve_clock
from tuner.study.settings import EvalSettings

if TYPE_CHECKING:
    from matplotlib.figure import Figure

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PICK = "benchmarks/data/openqa-preset-2048-fastkv-2026-12-04/seed0.recommended.json"
PRESSES = {"snapkv": "SnapKVPress", "expected-attention": "ExpectedAttentionPress", "tova": "TOVAPress"}
"""kvpress presses by short name -> class (kvpress 0.5.5's README lists no single best press)."""
QUESTION_MARKER = "Question:"
SPEED = "@speed"
"""The ``example`` field of a method's timing row."""
UNPRUNED = "unpruned"
VENV_CONTROL = "unpruned (kvpress venv)"
PICK = "tuned pick"


@dataclass(frozen=True)
class Spec:
    """One row of the table.

    Attributes:
        name: the row's label. side: ``lazyllm`` (this venv) or ``kvpress`` (the worker).
        method: a :data:`lazyllm.methods.METHODS` name (``baseline``, ``lazyllm``, ``gemfilter``, ``tsp``)
            or ``press``. schedule: for ``lazyllm``. options: a peer's knobs. press: kvpress class name
            (None: the venv control). ratio: the press's ``compression_ratio``.
    """

    name: str
    side: str
    method: str
    schedule: Schedule | None = None
    options: dict[str, float] = field(default_factory=dict)
    press: str | None = None
    ratio: float | None = None

    def describe(self) -> dict[str, Any]:
        return {
            "side": self.side, "method": self.method, "options": self.options, "press": self.press,
            "compression_ratio": self.ratio, "schedule": None if self.schedule is None else self.schedule.to_dict(),
        }  # fmt: skip


def kept_share(schedule: Schedule, n: int) -> float:
    """The share of the unpruned (token, layer) KV pairs a frozen schedule keeps for an ``n``-token prompt."""
    return sum(schedule.keep_counts(n)) / (n * schedule.num_layers)


def plan(
    pick: Schedule,
    model: str,
    dims: ModelDims,
    lengths: Sequence[int],
    presses: Sequence[str],
    press_ratios: Sequence[float | None] = (None, 0.5),
) -> list[Spec]:
    """The table's rows (see the module docstring), in order; each press at each of ``press_ratios``
    (``compression_ratio``; None: the pick's KV memory)."""
    layers = dims.num_layers
    mid = int(statistics.median(lengths))
    target = float(statistics.median(METHODS["lazyllm"].flop_speedup(dims, n, pick, {}) for n in lengths))
    specs = [
        Spec(UNPRUNED, "lazyllm", "baseline"),
        Spec(PICK, "lazyllm", "lazyllm", pick.with_revival("frozen")),
        Spec("paper-style", "lazyllm", "lazyllm", Schedule.paper_style(model, layers).with_revival("frozen")),
    ]
    for peer in ("gemfilter", "tsp"):
        specs.append(Spec(f"{peer} (published)", "lazyllm", peer))
        matched = match_speedup(peer, dims, mid, target)
        if matched is not None:
            specs.append(Spec(f"{peer} (pick's speed)", "lazyllm", peer, options={k: round(v, 4) for k, v in matched.items()}))  # fmt: skip
    specs.append(Spec(VENV_CONTROL, "kvpress", "press"))
    picks = round(1.0 - kept_share(pick, mid), 4)
    for short in presses:
        for r in press_ratios:
            at = "pick's KV" if r is None else f"{100 * (1 - r):g}% KV"
            ratio = picks if r is None else r
            specs.append(
                Spec(f"kvpress {short} ({at})", "kvpress", "press", press=PRESSES[short], ratio=ratio)
            )
    return specs


def press_ratios(text: str) -> list[float | None]:
    """``--press-ratios``: ``pick`` (None, the pick's KV memory) or a ``compression_ratio`` in (0, 1)."""
    out: list[float | None] = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        if item == "pick":
            out.append(None)
            continue
        try:
            ratio = float(item)
        except ValueError:
            raise ValueError(f"{item!r} is neither `pick` nor a number; give e.g. pick,0.5") from None
        if not 0 < ratio < 1:
            raise ValueError(f"{item} is outside (0, 1); a compression ratio is the share of the KV dropped")
        out.append(ratio)
    if not out:
        raise ValueError("no ratio given; give e.g. pick,0.5")
    return out


def split_prompt(ids: Sequence[int], marker: Sequence[int]) -> tuple[list[int], list[int]]:
    """``(context, question)``: ``ids`` cut before the last occurrence of ``marker`` (the template's
    ``Question:`` tokens); ``context + question == ids``. A prompt without it is an error."""
    m = len(marker)
    for start in range(len(ids) - m, 0, -1):
        if list(ids[start : start + m]) == list(marker):
            return list(ids[:start]), list(ids[start:])
    raise ValueError(f"no {QUESTION_MARKER!r} in the prompt's ids: cannot split a context from its question")


def kv_tokens(spec: Spec, generator: Any, n: int, layers: int) -> list[int]:
    """Tokens each layer holds in its KV cache after the prefill of an ``n``-token prompt (LazyLLM side):
    the unpruned model all ``n``; a frozen schedule (and TSP, one) the tokens each layer computed;
    GemFilter the ``k`` tokens it re-runs the whole model on (its filter pass's cache is dropped)."""
    if spec.method == "baseline":
        return [n] * layers
    if spec.method == "lazyllm":
        assert spec.schedule is not None and spec.schedule.revival.policy == "frozen"
        return spec.schedule.keep_counts(n)
    if spec.method == "tsp":
        return list(generator.schedule(n).keep_counts(n))
    if spec.method == "gemfilter":
        return [int(generator.k.count(n))] * layers
    raise ValueError(f"no KV accounting for method {spec.method!r}")


def bytes_per_token_layer(model: Any) -> int:
    """Bytes of one token's keys and values in one layer: ``2 x kv_heads x head_dim x element size``."""
    config = model.config
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return 2 * kv_heads * head_dim * next(model.parameters()).element_size()


# Rows -----------------------------------------------------------------------------------------------
def check_plan(path: Path, specs: Sequence[Spec]) -> None:
    """Write the rows' definitions beside them once; a rerun with another definition under a name stops."""
    table = {s.name: s.describe() for s in specs}
    if path.exists():
        old = json.loads(path.read_text())
        clash = [n for n in table if n in old and old[n] != table[n]]
        if clash:
            raise SystemExit(f"{path}: row {clash[0]!r} differs from the recorded one; use another --out")
        table = {**old, **table}
    path.write_text(json.dumps(table, indent=1, sort_keys=True))


def example_row(
    spec: Spec, ex: Example, context_tokens: int, *, prediction: str, new_tokens: int, score: float,
    baseline_score: float, kl: float, top1: float, kv: int, kv_unpruned: int, flop_speedup: float,
) -> dict[str, Any]:  # fmt: skip
    return {
        "method": spec.name, "example": ex.key, "dataset": ex.dataset, "record_id": ex.record_id,
        "side": spec.side, "prompt_tokens": len(ex.input_ids), "context_tokens": context_tokens,
        "score": score, "baseline_score": baseline_score, "prediction": prediction, "new_tokens": new_tokens,
        "kl": kl, "top1": top1, "kv_bytes": kv, "kv_bytes_unpruned": kv_unpruned, "flop_speedup": flop_speedup,
    }  # fmt: skip


def merge_worker_line(
    line: dict[str, Any], spec: Spec, ex: Example, context_tokens: int, stop: StopCriteria,
    baseline_score: float, unpruned: str | None, kv_unpruned: int,
) -> dict[str, Any]:  # fmt: skip
    """A worker's ``example`` line as a table row: its answer ids decoded and cut by this side's stop
    rule and scored exactly as the tuner scores (:func:`tuner.evaluation.runner.score_prediction`)."""
    if line.get("kind") != "example" or line.get("method") != spec.name or line.get("example") != ex.key:
        raise ValueError(f"worker line {str(line)[:120]!r} is not ({spec.name!r}, {ex.key!r})")
    ids = [int(t) for t in line["token_ids"]]
    if not 1 <= len(ids) <= ex.max_new_tokens:
        raise ValueError(f"worker answer of {len(ids)} tokens for a limit of {ex.max_new_tokens}")
    prediction = stop.text(ids) or ""
    return example_row(
        spec, ex, context_tokens, prediction=prediction, new_tokens=len(ids),
        score=score_prediction(ex, prediction, unpruned), baseline_score=baseline_score,
        kl=float(line["kl"]), top1=float(line["top1"]), kv=int(line["kv_bytes"]), kv_unpruned=kv_unpruned,
        flop_speedup=1.0,
    )  # fmt: skip


# The table ------------------------------------------------------------------------------------------
def _result(row: dict[str, Any], score_key: str = "score") -> ExampleResult:
    return ExampleResult(
        dataset=row["dataset"], record_id=row["record_id"], method=row["method"], prediction=row["prediction"],
        score=float(row[score_key]), ttft_s=0.0, total_s=0.0, prompt_tokens=int(row["prompt_tokens"]),
        new_tokens=int(row["new_tokens"]), prompt_computed_fraction=1.0,
    )  # fmt: skip


def _paired_loss(mine: Sequence[dict[str, Any]], reference: dict[str, dict[str, Any]]) -> Estimate | None:
    """The loss of ``mine`` against ``reference``'s answers (rows by example), on the examples both have."""
    paired = [r for r in mine if r["example"] in reference]
    if not paired:
        return None
    return loss_estimate([_result(r) for r in paired], [_result(reference[r["example"]]) for r in paired])


def summarize(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> list[dict[str, Any]]:
    """Per row name (in ``names`` order, those with examples): n, loss with its interval, KL, KV, speeds;
    a press's ``own_loss`` is against the kvpress venv's unpruned model on the examples both have (its
    own side's unpruned answers; for this side's rows the unpruned model is its own); ``vs_pick``: its
    loss against the tuned pick's answers, paired on the examples both have (None without the pick)."""
    out = []
    control = {r["example"]: r for r in rows if r["method"] == VENV_CONTROL}
    picked = {r["example"]: r for r in rows if r["method"] == PICK and r["example"] != SPEED}
    for name in names:
        mine = [r for r in rows if r["method"] == name and r["example"] != SPEED]
        speed = next((r["speed"] for r in rows if r["method"] == name and r["example"] == SPEED), None)
        if not mine:
            continue
        loss = loss_estimate([_result(r) for r in mine], [_result(r, "baseline_score") for r in mine])
        drifts = [
            ExampleDrift(r["dataset"], r["record_id"], float(r["kl"]), float(r["top1"]), None, 1)
            for r in mine
        ]
        weights = dict(zip((r["example"] for r in mine), macro_weights([r["dataset"] for r in mine])))
        own = _paired_loss(mine, control) if mine[0]["side"] == "kvpress" else loss
        vs_pick = _paired_loss(mine, picked)
        out.append({
            "name": name, "n": len(mine), "side": mine[0]["side"], "loss": loss, "own_loss": own,
            "vs_pick": vs_pick,
            "kl": kl_so_far(drifts, weights),
            "kv_bytes": statistics.fmean(r["kv_bytes"] for r in mine),
            "kv_share": statistics.fmean(r["kv_bytes"] / r["kv_bytes_unpruned"] for r in mine),
            "flop_speedup": statistics.median(r["flop_speedup"] for r in mine),
            "ttft_speedup": None if speed is None else SpeedMeasurement.from_dict(speed).speedup,
            "speed": speed,
        })  # fmt: skip
    return out


def _interval(est: Any) -> str:
    return "-" if est is None else f"{est.value:.2f} [{est.low:.2f}, {est.high:.2f}]"


def markdown(summary: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| method | TTFT speedup (measured) | FLOP speedup | KV cache kept after prefill | task loss [90%] "
        "| task loss vs own side's unpruned [90%] | loss vs the tuned pick, paired [90%] | KL (nats) | n |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        ttft = "not timed" if s["ttft_speedup"] is None else f"{s['ttft_speedup']:.2f}x"
        lines.append(
            f"| {s['name']} | {ttft} | {s['flop_speedup']:.2f}x | {s['kv_bytes'] / 2**20:.1f} MiB "
            f"({100 * s['kv_share']:.0f}%) | {_interval(s['loss'])} | {_interval(s['own_loss'])} | "
            f"{_interval(s['vs_pick'])} | {s['kl']:.3f} | {s['n']} |"
        )
    return "\n".join(lines) + "\n"


# Running --------------------------------------------------------------------------------------------
class Recorder:
    """The rows file: what is done, and appending one row at a time (flushed)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows = read_rows(path)
        self.done = {(r["method"], r["example"]) for r in self.rows}

    def add(self, row: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.rows.append(row)
        self.done.add((row["method"], row["example"]))


def chunked(items: Sequence[Any], size: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


def interleave(examples: Sequence[Example]) -> list[Example]:
    """The examples alternating between datasets, each dataset's order kept."""
    by: dict[str, list[Example]] = {}
    for ex in examples:
        by.setdefault(ex.dataset, []).append(ex)
    queues = list(by.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


def worker_lines(python: str, request: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Run :mod:`kvpress_worker` under ``python`` on ``request`` and yield its JSON lines as they come."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    worker = str(Path(__file__).with_name("kvpress_worker.py"))
    try:
        with subprocess.Popen([python, worker, f.name], stdout=subprocess.PIPE, text=True, env=env) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                yield json.loads(line)
            if proc.wait() != 0:
                raise SystemExit(f"kvpress worker ({python}) failed with exit code {proc.returncode}")
    finally:
        os.unlink(f.name)


class Table:
    """Everything one run holds: model, examples, rows, generators."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.set_num_threads(args.threads)
        self.args = args
        self.model, self.tokenizer = load_model(args.model, device="cpu", dtype=args.dtype)
        self.layers = int(self.model.config.num_hidden_layers)
        self.dims = ModelDims.from_config(self.model.config)
        config = EvalSettings(
            model=args.model, task="openqa", split="test", n_examples=math.ceil(args.n / 2),
            max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
            dtype=args.dtype, openqa_dir=args.openqa_dir,
        )  # fmt: skip
        self.evaluator = Evaluator(self.model, self.tokenizer, config, Path(args.cache), progress=False)
        self.examples = interleave(self.evaluator.examples)[: args.n]
        self.evaluator.examples = self.examples
        self.fidelity = FidelityEvaluator(self.evaluator)
        pick = Schedule.load(args.pick)
        lengths = [len(ex.input_ids) for ex in self.examples]
        self.specs = plan(pick, args.model, self.dims, lengths, args.presses, args.press_ratios)
        self.recorder = Recorder(Path(args.out))
        check_plan(Path(args.out).with_suffix(".methods.json"), self.specs)
        self.generators = {
            s.name: make_method(s.method, self.model, self.tokenizer, s.schedule, options=s.options)
            for s in self.specs
            if s.side == "lazyllm"
        }
        marker = self.tokenizer(QUESTION_MARKER, add_special_tokens=False)["input_ids"]
        self.splits = {ex.key: split_prompt(ex.input_ids, marker) for ex in self.examples}
        self.per_token = bytes_per_token_layer(self.model)
        self.kvpress_python = args.kvpress_python
        self.clock = resolve_clock(args.timing_clock, next(self.model.parameters()).device)

    def todo(self, spec: Spec, examples: Sequence[Example] | None = None) -> list[Example]:
        """The examples (of ``examples``, default all) that ``spec`` has no row for yet."""
        pool = self.examples if examples is None else examples
        return [ex for ex in pool if (spec.name, ex.key) not in self.recorder.done]

    def run(self) -> None:
        pending = sum(len(self.todo(s)) + ((s.name, SPEED) not in self.recorder.done) for s in self.specs)
        print(
            f"{len(self.examples)} examples x {len(self.specs)} rows; {len(self.recorder.rows)} rows in "
            f"{self.recorder.path}, {pending} to do"
        )
        minutes = self.args.minutes
        deadline = None if minutes is None else time.monotonic() + 60 * minutes
        with tqdm(total=pending, desc="kvpress table") as bar:
            self.time_all(bar)
            for chunk in chunked(self.examples, self.args.chunk):
                if all(not self.todo(s, chunk) for s in self.specs):
                    continue
                if deadline is not None and time.monotonic() > deadline:  # at a chunk's edge: every row has
                    tqdm.write(
                        f"stopped after --minutes {minutes:g}; rerun the command to resume"
                    )  # the same n
                    return
                self.run_chunk(chunk, bar)

    def time_all(self, bar: Any) -> None:
        """One TTFT measurement per row without one, on the example of median prompt length."""
        timing = self.evaluator.timing_example(self.examples)
        ids = torch.tensor(timing.input_ids)
        n = len(timing.input_ids)
        for spec in self.specs:
            if spec.side != "lazyllm" or (spec.name, SPEED) in self.recorder.done:
                continue
            flops = METHODS[spec.method].flop_speedup(self.dims, n, spec.schedule, spec.options)
            speed = measure_speedup(
                prefill_timer(self.evaluator.baseline_engine, ids, self.clock),
                prefill_timer(self.generators[spec.name], ids, self.clock),
                flops, rounds=self.args.timing_rounds, clock=self.clock,
            )  # fmt: skip
            self.recorder.add(
                {"method": spec.name, "example": SPEED, "timed": timing.key, "speed": speed.to_dict()}
            )
            bar.update(1)
        presses = [
            s.name for s in self.specs if s.side == "kvpress" and (s.name, SPEED) not in self.recorder.done
        ]
        if presses:
            context, question = self.splits[timing.key]
            request = self.request([], {
                "key": timing.key, "context_ids": context, "question_ids": question,
                "rounds": self.args.timing_rounds, "clock": self.clock, "methods": presses,
            })  # fmt: skip
            for line in worker_lines(self.kvpress_python, request):
                if line["kind"] == "speed":
                    self.recorder.add({"method": line["method"], "example": SPEED, "timed": timing.key, "speed": line["speed"]})  # fmt: skip
                    bar.update(1)

    def request(self, examples: list[dict[str, Any]], timing: dict[str, Any] | None) -> dict[str, Any]:
        stop = StopCriteria.build(self.model, self.tokenizer, None, ())
        return {
            "model": resolve(self.args.model)[0], "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "threads": self.args.threads, "eos_ids": sorted(stop.eos_ids),
            "methods": [{"name": s.name, "press": s.press, "compression_ratio": s.ratio} for s in self.specs if s.side == "kvpress"],
            "examples": examples, "timing": timing,
        }  # fmt: skip

    def run_chunk(self, chunk: list[Example], bar: Any) -> None:
        if not any((s.name, ex.key) not in self.recorder.done for s in self.specs for ex in chunk):
            return
        part = copy.copy(self.evaluator)
        part.examples = chunk
        fid = copy.copy(self.fidelity)
        fid.evaluator = part
        fid.prefixes = {}
        refs = fid.references()  # the unpruned answers and logits, from one unpruned prefill each (cached)
        base = part.baseline()
        for ex in chunk:
            self.run_ours(ex, fid, refs[ex.key], base[ex.key], bar)
            fid.prefixes.clear()
        self.run_kvpress(chunk, refs, base, bar)

    def run_ours(self, ex: Example, fid: FidelityEvaluator, ref: Any, base: Any, bar: Any) -> None:
        n = len(ex.input_ids)
        kv_unpruned = n * self.layers * self.per_token
        context = len(self.splits[ex.key][0])
        answer = tuple(ref.answer_ids.tolist())
        for spec in self.specs:
            if spec.side != "lazyllm" or (spec.name, ex.key) in self.recorder.done:
                continue
            start = time.perf_counter()
            gen = self.generators[spec.name]
            flops = METHODS[spec.method].flop_speedup(self.dims, n, spec.schedule, spec.options)
            kv = sum(kv_tokens(spec, gen, n, self.layers)) * self.per_token
            if spec.method == "baseline":
                prediction, new, score, kl, top1 = base.prediction, base.new_tokens, base.score, 0.0, 1.0
            else:
                engine = self.engine_of(spec, gen, n)
                if engine is not None:  # a LazyLLM engine: answer and forced logits from one prefill
                    prefix = fid.prefix(ex)
                    (result,) = run_examples([(engine, ex, prefix)], forced=[answer])
                    assert result.forced_logits is not None
                    logits = result.forced_logits
                else:  # GemFilter: its answer; the KL along the unpruned model on the kept tokens
                    result = gen.generate(torch.tensor(ex.input_ids), max_new_tokens=ex.max_new_tokens, stop_strings=ex.stop_strings)  # fmt: skip
                    assert isinstance(gen, GemFilter)
                    kept = torch.tensor(ex.input_ids)[gen.select(torch.tensor(ex.input_ids)).kept.cpu()]
                    logits = fid.keep_all.forced_logits(kept, answer)
                prediction = result.text or ""
                new = len(result.token_ids)
                score = score_prediction(ex, prediction, self.evaluator.unpruned(ex))
                kl, top1 = drift(ref, logits)
            row = example_row(
                spec, ex, context, prediction=prediction, new_tokens=new, score=score, baseline_score=base.score,
                kl=kl, top1=top1, kv=kv, kv_unpruned=kv_unpruned, flop_speedup=flops,
            )  # fmt: skip
            self.recorder.add({**row, "seconds": time.perf_counter() - start})
            bar.update(1)

    def engine_of(self, spec: Spec, gen: Any, n: int) -> LazyLLM | None:
        """The LazyLLM engine a row generates with (TSP: its one-stage frozen schedule for this length),
        None for GemFilter (two passes)."""
        if spec.method == "lazyllm":
            assert isinstance(gen, LazyLLM)
            return gen
        if spec.method == "tsp":
            return LazyLLM(self.model, gen.schedule(n).with_revival("frozen"), tokenizer=self.tokenizer, strict_model_name=False)  # fmt: skip
        return None

    def run_kvpress(self, chunk: list[Example], refs: dict[str, Any], base: dict[str, Any], bar: Any) -> None:
        specs = {s.name: s for s in self.specs if s.side == "kvpress"}
        wanted = []
        for ex in chunk:
            names = [n for n in specs if (n, ex.key) not in self.recorder.done]
            if names:
                context, question = self.splits[ex.key]
                wanted.append({
                    "key": ex.key, "context_ids": context, "question_ids": question,
                    "answer_ids": refs[ex.key].answer_ids.tolist(), "max_new_tokens": ex.max_new_tokens,
                    "stop_strings": list(ex.stop_strings), "methods": names,
                })  # fmt: skip
        if not wanted:
            return
        by_key = {ex.key: ex for ex in chunk}
        for line in worker_lines(self.kvpress_python, self.request(wanted, None)):
            if line["kind"] != "example":
                continue
            ex = by_key[line["example"]]
            stop = StopCriteria.build(self.model, self.tokenizer, None, ex.stop_strings)
            n = len(ex.input_ids)
            row = merge_worker_line(
                line, specs[line["method"]], ex, len(self.splits[ex.key][0]), stop, base[ex.key].score,
                self.evaluator.unpruned(ex), n * self.layers * self.per_token,
            )  # fmt: skip
            self.recorder.add({**row, "seconds": float(line["seconds"])})
            bar.update(1)


def figure(summary: Sequence[dict[str, Any]], title: str, budget: float = 2.0) -> Figure:
    """Task loss (90% interval) against measured TTFT speedup, one point per timed row, each labelled
    with its name and n, the loss ``budget`` drawn across."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8.4, 5.2))
    for s in summary:
        if s["ttft_speedup"] is None:
            continue
        loss = s["loss"]
        marker = {"kvpress": "s", "lazyllm": "o"}[s["side"]]
        color = "tab:red" if s["name"] == PICK else ("tab:green" if s["side"] == "kvpress" else "tab:blue")
        ax.errorbar(
            [s["ttft_speedup"]], [loss.value], yerr=[[loss.value - loss.low], [loss.high - loss.value]],
            fmt=marker, color=color, capsize=3,
        )  # fmt: skip
        ax.annotate(
            f"{s['name']} (n={s['n']})", (s["ttft_speedup"], loss.value), textcoords="offset points",
            xytext=(5, 4), fontsize=7,
        )  # fmt: skip
    ax.axhline(budget, linestyle="--", color="grey", linewidth=1)
    ax.annotate(
        f"budget {budget:g} points",
        (ax.get_xlim()[1], budget),
        textcoords="offset points",
        xytext=(-4, 3),
        ha="right",
    )
    ax.axhline(0, color="black", linewidth=0.5)
    ax.axvline(1, color="black", linewidth=0.5)
    ax.set_xlabel("TTFT speedup, measured (x, against each side's unpruned prefill)")
    ax.set_ylabel("task loss against the unpruned model (points, 90% interval)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def write_table(specs: Sequence[Spec], rows: Sequence[dict[str, Any]], path: Path, header: str) -> str:
    """The markdown table at ``path`` and its figure beside it (``.png``); returns the table."""
    summary = summarize(rows, [s.name for s in specs])
    text = header + markdown(summary)
    path.write_text(text)
    if summary:
        fig = figure(summary, header.split(", pick ")[0].split(";")[0])
        fig.savefig(path.with_suffix(".png"), dpi=120)
        pyplot().close(fig)
    return text


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--openqa-dir", default=None, help="HotpotQA/SQuAD JSON folder (default: $OPENQA_DIR)")
    p.add_argument("--n", type=int, default=300, help="test examples, alternating datasets")
    p.add_argument("--pick", default=DEFAULT_PICK, help="the tuned schedule's JSON")
    p.add_argument(
        "--presses", default=",".join(PRESSES), help=f"comma-separated, of {', '.join(PRESSES)} (empty: none)"
    )
    p.add_argument(
        "--press-ratios",
        default="pick,0.5",
        help="comma-separated compression ratios the presses run at; `pick`: the pick's KV memory",
    )
    p.add_argument("--max-prompt-tokens", type=int, default=2048)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (the timing runs on one thread on a CPU)"
    )
    p.add_argument("--timing-rounds", type=int, default=3)
    p.add_argument("--timing-clock", default="auto")
    p.add_argument(
        "--chunk", type=int, default=8, help="examples per kvpress worker call (each loads the model)"
    )
    p.add_argument("--kvpress-python", default=".venv-kvpress/bin/python", help="the kvpress venv's python")
    p.add_argument(
        "--minutes", type=float, default=None, help="stop at the first chunk edge after this many minutes"
    )
    p.add_argument("--out", default="benchmarks/data/kvpress-table-openqa-2048.jsonl")
    p.add_argument("--table", default=None, help="markdown table (default: --out with .md)")
    p.add_argument("--cache", default="runs/kvpress-table-cache", help="unpruned answers and references")
    args = p.parse_args(argv)
    args.presses = [s for s in args.presses.split(",") if s]
    bad = [s for s in args.presses if s not in PRESSES]
    if bad:
        p.error(f"--presses: unknown {bad[0]!r}; valid: {', '.join(PRESSES)}")
    try:
        args.press_ratios = press_ratios(args.press_ratios)
    except ValueError as e:
        p.error(f"--press-ratios {args.press_ratios}: {e}")
    if args.n < 1:
        p.error(f"--n {args.n}: give at least 1 example")
    if not Path(args.pick).is_file():
        p.error(f"--pick {args.pick}: no such schedule file")
    if not Path(args.kvpress_python).exists():
        p.error(f"--kvpress-python {args.kvpress_python}: not found; run `make kvpress-setup` first")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    table = Table(args)
    table.run()
    header = (
        f"kvpress table: {args.model}, open-QA test, {args.max_prompt_tokens}-token prompts, {args.dtype}, "
        f"pick {args.pick}; rows {args.out}; TTFT clock {table.clock}, {args.timing_rounds} rounds\n\n"
    )
    text = write_table(
        table.specs, table.recorder.rows, Path(args.table or Path(args.out).with_suffix(".md")), header
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

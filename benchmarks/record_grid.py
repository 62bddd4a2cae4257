"""A resumable grid: task score and teacher-forced KL of hand-made schedules and peers, per example.

    python benchmarks/record_grid.py [--task openqa] [--split validation] [--n-examples 200]
        [--max-prompt-tokens 1024] [--dtype auto] [--openqa-dir DIR] [--minutes M] [--out FILE.jsonl]

For every example of ``--task`` (``n_examples`` per dataset, built by the product,
:class:`tuner.evaluation.runner.Evaluator`) and every schedule of the grid (families ``paper-style``:
:func:`tuner.study.handmade.hand_made_grid` plus :meth:`lazyllm.Schedule.paper_style`; ``one-stage``:
:func:`tuner.study.handmade.one_stage_grid`; ``gradual``: 25% or 40% pruned after each quarter of the
depth; ``peer-rules``: LazyLLM schedules ranking tokens by the peers' scoring rules, FastKV's and
GemFilter's (:mod:`lazyllm.scoring`); ``search-picks``: schedules README studies recommended; a
schedule in two families keeps its first name; with ``--peers``, ``peers``: every
:func:`lazyllm.methods.peer_names` method keeping 10/30/50% of the prompt, which have no KL and
which the decision rule's replay cannot pick); and ``control``: the unpruned model run exactly as the
schedules are (its task loss is the measurement's noise floor; the replay and the prior leave it out),
one JSON line is appended to ``--out``: the task score (:meth:`Evaluator.evaluate`), the unpruned
score (the baseline), the mean teacher-forced KL per answer token in nats and top-1 agreement
(:meth:`tuner.evaluation.fidelity.FidelityEvaluator.example_drift`; null for the peers, which are not
LazyLLM engines), and the FLOP speedup of TTFT (:meth:`lazyllm.methods.Method.flop_speedup`).
Every schedule runs with ``frozen`` revival, the study's default.

Examples alternate between datasets (HotpotQA, SQuAD, HotpotQA, ...), so any prefix of the rows
is balanced; ``--split validation,test`` alternates chunks of both splits, each into its own file.

Resumable across sessions: rows already in ``--out`` (by schedule and example) are skipped, a
truncated last line (a run killed mid-write) is cut off first, and the unpruned answers and the
fidelity references live in ``--cache`` (keyed by the settings, so a rerun reuses them). The schedules are written once to
``<out>.schedules.json``; a rerun whose grid differs under the same names stops. Examples are done
in chunks of ``--chunk`` (the baseline is computed per chunk), each example's schedules
together (their answers decoded as one batch, :func:`tuner.evaluation.runner.run_examples`); ``--minutes``
stops after the current example once that much time is spent. Prints the rate (rows per minute).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.flops import ModelDims
from lazyllm.methods import METHODS, make_method, peer_names
from lazyllm.models import DTYPES
from tuner.evaluation.fidelity import FidelityEvaluator
from tuner.evaluation.recorder import read_rows as rows_of
from tuner.evaluation.runner import Evaluator, Example, result_of, run_examples
from tuner.study.handmade import hand_made_grid, one_stage_grid
from tuner.study.settings import EvalSettings

PEER_KEEPS = (0.1, 0.3, 0.5)
CONTROL = "control"
"""The family of the keep-all control row, which the replay and the prior builder leave out."""


def peer_rules(model: str, layers: int) -> dict[str, Schedule]:
    """LazyLLM schedules with the peers' scoring rules (FastKV's and GemFilter's, :mod:`lazyllm.scoring`)."""
    quarters = sorted({max(1, round(i * layers / 4)) for i in (1, 2, 3)} - {layers - 1})
    mid, late = layers // 4, layers // 2
    return {
        "fastkv rule 30% after each quarter": Schedule.from_layers(model, layers, dict.fromkeys(quarters, 30)).with_scoring("fastkv"),
        f"fastkv rule keep=30% after layer {mid}": Schedule.from_layers(model, layers, {mid: 70}).with_scoring("fastkv"),
        f"gemfilter rule keep=50% after layer {late}": Schedule.from_layers(model, layers, {late: 50}).with_scoring("gemfilter"),
        "fastkv rule 20% after each quarter": Schedule.from_layers(model, layers, dict.fromkeys(quarters, 20)).with_scoring("fastkv"),
    }  # fmt: skip


def search_picks(model: str, layers: int) -> dict[str, Schedule]:
    """What README studies recommended (SmolLM2, 30 layers): seed 0's pick keeps 40% after layer 14
    with FastKV's rule (2026-12-01); the open-QA preset's picks at 2048 tokens, seeds 0, 1 and 2
    (2026-12-04, GemFilter's rule: drop 80% after layer 25; 25% after 21; 50% after 22 and 25% after
    25). Other depths get the same shapes at the same relative depths (never the last layer, which
    cannot prune)."""

    def at(layer: int) -> int:
        return min(layers - 2, round(layer * layers / 30))

    return {
        f"search pick: fastkv rule keep=40% after layer {at(14)}": Schedule.from_layers(model, layers, {at(14): 60}).with_scoring("fastkv"),
        f"preset pick: gemfilter rule drop 80% after layer {at(25)}": Schedule.from_layers(model, layers, {at(25): 80}).with_scoring("gemfilter"),
        f"preset pick: gemfilter rule drop 25% after layer {at(21)}": Schedule.from_layers(model, layers, {at(21): 25}).with_scoring("gemfilter"),
        f"preset pick: gemfilter rule drop 50% after layer {at(22)}, 25% after {at(25)}": Schedule.from_layers(model, layers, {at(22): 50, at(25): 25}).with_scoring("gemfilter"),
    }  # fmt: skip


def grid(
    model: str, layers: int, *, peers: bool = False
) -> dict[str, tuple[str, str, Schedule | None, dict[str, float]]]:
    """name -> (family, method, schedule or None, method options)."""
    out: dict[str, tuple[str, str, Schedule | None, dict[str, float]]] = {}
    paper = {"paper-style default": Schedule.paper_style(model, layers), **hand_made_grid(model, layers)}
    quarters = sorted({max(1, round(i * layers / 4)) for i in (1, 2, 3)} - {layers - 1})
    gradual = {f"gradual {pct}% after each quarter": Schedule.from_layers(model, layers, dict.fromkeys(quarters, pct)) for pct in (25, 40)}  # fmt: skip
    families = (
        ("paper-style", paper), ("one-stage", one_stage_grid(model, layers)), ("gradual", gradual),
        ("peer-rules", peer_rules(model, layers)), ("search-picks", search_picks(model, layers)),
    )  # fmt: skip
    for family, schedules in families:
        for name, schedule in schedules.items():
            frozen = schedule.with_revival("frozen")
            if all(frozen != s for _, _, s, _ in out.values()):  # one name per schedule (the first)
                out[name] = (family, "lazyllm", frozen, {})
    # the measurement's noise floor: the unpruned model through the schedules' path (resumed from the
    # captured prefix, decoded in their batch), against the baseline's answer; never a candidate
    keep_all = Schedule.keep_all(model, layers).with_revival("frozen")
    out["keep-all (control)"] = (CONTROL, "lazyllm", keep_all, {})
    for peer in peer_names() if peers else ():
        knob = METHODS[peer].size_knob
        assert knob is not None
        for keep in PEER_KEEPS:
            out[f"{peer} {knob}={keep}"] = ("peers", peer, None, {knob: keep})
    return out


def dtype_suffix(dtype: str) -> str:
    """The default rows file's dtype part: none for ``auto`` (the grids recorded before the flag)."""
    return "" if dtype == "auto" else f"-{dtype}"


def read_rows(path: Path) -> set[tuple[str, str]]:
    """(schedule, example) of the rows in ``path``; a truncated last line is cut off the file."""
    return {(row["schedule"], row["example"]) for row in rows_of(path)}


def check_schedules(path: Path, table: dict[str, Any]) -> None:
    """Write the grid beside the rows once; a rerun with other schedules under the same names stops."""
    if path.exists():
        old = json.loads(path.read_text())
        clash = [n for n in table if n in old and old[n] != table[n]]
        if clash:
            raise SystemExit(
                f"{path}: schedule {clash[0]!r} differs from the recorded one; use another --out"
            )
        table = {**old, **table}
    path.write_text(json.dumps(table, indent=1, sort_keys=True))


def view(evaluator: Evaluator, examples: list[Example]) -> Evaluator:
    """The evaluator on some of its examples (model, engine and baseline cache shared)."""
    part = copy.copy(evaluator)
    part.examples = examples
    return part


def interleave(examples: list[Example]) -> list[Example]:
    """The examples alternating between datasets, each dataset's order kept (round-robin)."""
    by: dict[str, list[Example]] = {}
    for ex in examples:
        by.setdefault(ex.dataset, []).append(ex)
    queues = list(by.values())
    return [q[i] for i in range(max(map(len, queues), default=0)) for q in queues if i < len(q)]


class Split:
    """One split's examples, output file, rows already recorded and the examples still to do."""

    def __init__(
        self, args: argparse.Namespace, split: str, model: Any, tokenizer: Any, table: dict[str, Any]
    ) -> None:
        self.out = Path(
            args.out.replace("{split}", split)
            if args.out
            else f"benchmarks/data/grid-{args.model}-{args.task}-{split}-{args.max_prompt_tokens}{dtype_suffix(args.dtype)}.jsonl"
        )
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.done = read_rows(self.out)
        check_schedules(
            self.out.with_suffix(".schedules.json"),
            {n: {"family": f, "method": m, "options": o, "schedule": s.to_json() if s else None} for n, (f, m, s, o) in table.items()},
        )  # fmt: skip
        config = EvalSettings(
            model=args.model, task=args.task, split=split, n_examples=args.n_examples,
            max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
            dtype=args.dtype, data_dir=args.data_dir, openqa_dir=args.openqa_dir,
        )  # fmt: skip
        self.evaluator = Evaluator(model, tokenizer, config, Path(args.cache), progress=False)
        self.fidelity = FidelityEvaluator(self.evaluator)
        self.todo = [
            ex
            for ex in interleave(self.evaluator.examples)
            if any((n, ex.key) not in self.done for n in table)
        ]
        print(
            f"{split}: {len(self.evaluator.examples)} examples x {len(table)} schedules; "
            f"{len(self.done)} rows in {self.out}, {len(self.todo)} examples to do"
        )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="openqa")
    p.add_argument(
        "--split", default="validation", help="validation, test, or both comma-separated (chunks alternate)"
    )
    p.add_argument("--n-examples", type=int, default=200, help="examples per dataset")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="model dtype (auto: float32 on CPU); not auto names the rows file",
    )
    p.add_argument("--openqa-dir", default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument(
        "--peers", action="store_true", help="also the peer methods (no KL: the replay skips them)"
    )
    p.add_argument("--chunk", type=int, default=4, help="examples whose baseline is computed together")
    p.add_argument("--minutes", type=float, default=None, help="stop after this many minutes")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (2 threads on a shared 2-core CPU run slower)"
    )
    p.add_argument("--out", default=None, help="rows file; '{split}' in it is replaced by the split")
    p.add_argument("--cache", default="runs/record-grid-cache", help="unpruned answers and references")
    args = p.parse_args(argv)
    names = args.split.split(",")
    if not names or any(n not in ("validation", "test") for n in names) or len(set(names)) < len(names):
        p.error(f"--split {args.split!r}: give validation, test or validation,test")
    if len(names) > 1 and args.out and "{split}" not in args.out:
        p.error("--out: with two splits, put '{split}' in the file name")

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, device="cpu", dtype=args.dtype)
    layers = int(model.config.num_hidden_layers)
    dims = ModelDims.from_config(model.config)
    table = grid(args.model, layers, peers=args.peers)
    splits = [Split(args, n, model, tokenizer, table) for n in names]
    generators = {n: make_method(m, model, tokenizer, s, options=o) for n, (_, m, s, o) in table.items()}
    engines = {
        n: LazyLLM(model, s, tokenizer=tokenizer) for n, (_, _, s, _) in table.items() if s is not None
    }

    start, written = time.monotonic(), 0
    deadline = None if args.minutes is None else start + 60 * args.minutes
    chunks = [
        (sp, c) for c in range(0, max(len(sp.todo) for sp in splits), args.chunk) for sp in splits if c < len(sp.todo)
    ]  # fmt: skip
    for sp, c in chunks:
        chunk = view(sp.evaluator, sp.todo[c : c + args.chunk])
        sp.fidelity.prefixes.clear()  # this chunk's prefixes only: the memory cap is never reached
        chunk_fid = copy.copy(sp.fidelity)
        chunk_fid.evaluator = chunk
        refs = chunk_fid.references()  # first: the baseline with it, from one unpruned prefill each
        base = chunk.baseline()
        with sp.out.open("a", encoding="utf-8") as sink:
            for ex in chunk.examples:
                names = [n for n in table if (n, ex.key) not in sp.done]
                if not names:
                    continue
                if deadline is not None and time.monotonic() > deadline:
                    return report(start, written)
                # the engines' answers from the example's captured prefix, decoded together (the same
                # answers as one at a time, sooner); the peers one at a time
                prefix = sp.fidelity.prefix(ex)
                ours = [n for n in names if n in engines]
                along = tuple(refs[ex.key].answer_ids.tolist())  # the KL's answer, from the same prefill
                answers = dict(
                    zip(
                        ours,
                        run_examples(
                            [(engines[n], ex, prefix) for n in ours],
                            batch_size=len(names),
                            forced=[along] * len(ours),
                        ),
                    )
                )
                for name in names:
                    family, method, schedule, options = table[name]
                    if name in answers:
                        result = result_of(name, ex, answers[name])
                    else:
                        (result,), _ = view(chunk, [ex]).evaluate(name, generators[name])
                    drift = (
                        sp.fidelity.drift_from(
                            engines[name], ex, refs[ex.key], prefix, answers[name].forced_logits
                        )
                        if name in answers
                        else None
                    )
                    row = {
                        "schedule": name, "family": family, "method": method, "example": ex.key,
                        "dataset": ex.dataset, "prompt_tokens": len(ex.input_ids),
                        "score": result.score, "baseline_score": base[ex.key].score,
                        "kl_nats_per_token": None if drift is None else drift.kl,
                        "top1_agreement": None if drift is None else drift.top1,
                        "flop_speedup": METHODS[method].flop_speedup(dims, len(ex.input_ids), schedule, options),
                        "new_tokens": result.new_tokens, "prediction": result.prediction,
                        "baseline_prediction": base[ex.key].prediction, "answers": list(ex.answers),
                    }  # fmt: skip
                    sink.write(json.dumps(row) + "\n")
                    sink.flush()
                    written += 1
    return report(start, written)


def report(start: float, written: int) -> int:
    minutes = (time.monotonic() - start) / 60
    print(f"wrote {written} rows in {minutes:.1f} min: {written / max(minutes, 1e-9):.1f} rows/minute")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does how a schedule scores tokens matter as much as where it prunes? A 2 x 2 ablation at equal FLOPs.

    python benchmarks/scoring_ablation.py [--task qa] [--max-prompt-tokens 512] [--n-examples 1]
        [--targets 1.3,1.6] [--rules last,fastkv] [--kl-only] [--out outputs/scoring_ablation]

Cells: **structure** (``one-stage``: one prune after layer ``round(15/32 * L)``, FastKV's TSP depth;
``gradual``: two equal prunes after layers ``round(L/3)`` and ``round(2L/3)``) x **rule** (``last``:
LazyLLM's last-token softmax attention, ``w1-softmax-none-mean``; ``fastkv``: the last 8 queries'
softmax attention, max-pooled with kernel 7, summed over heads, ``w8-softmax-max7-sum``; any other
:class:`~lazyllm.scoring.Scoring` spelling via ``--rules``) x **FLOP speedup** (``--targets``). Each
cell's keep share is set by bisection so that its FLOP-model prefill speedup
(:func:`lazyllm.flops.flop_speedup`, which counts the rule's scoring cost) at the median prompt length
reaches the target while keeping the most tokens. Revival is ``frozen`` (the study's default).

Per example of ``--task`` (default the LongBench QA group; ``openqa`` with ``--openqa-dir`` for the
HotpotQA/SQuAD tasks), on the validation and the test split:

* fidelity, teacher-forced along the unpruned greedy answer (:mod:`tuner.evaluation.fidelity`): mean KL(unpruned
  || pruned) per answer token in nats, and top-1 agreement;
* task loss: the unpruned model's LongBench score minus the pruned model's (points, free-running);
  left out with ``--kl-only`` (the free-running answer is most of a cell's cost).

Reported per split and target: each cell's macro mean with its bootstrap interval
(:func:`tuner.statistics.bootstrap.estimate`, datasets weighted equally), and the paired differences (same examples,
:func:`tuner.statistics.bootstrap.paired_estimate`) of rule B vs rule A within each structure and of gradual vs
one-stage within each rule. Results go to ``<out>/ablation.md`` and ``<out>/rows.json`` (written once
at the end; a rerun recomputes everything).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.models import DTYPES
from lazyllm.scoring import Scoring
from tuner.evaluation.fidelity import FidelityEvaluator
from tuner.evaluation.runner import Evaluator, run_example, score_prediction
from tuner.statistics.bootstrap import Estimate, estimate, macro_weights, paired_estimate
from tuner.study.settings import EvalSettings

STRUCTURES = ("one-stage", "gradual")
SIGNALS = {"kl": "KL (nats)", "top1": "top-1 agreement", "loss": "task loss (points)"}


def structure_schedule(structure: str, model: str, layers: int, keep: float) -> Schedule:
    """``one-stage``: keep ``keep`` after layer ``round(15/32 L)``; ``gradual``: keep ``keep`` after
    each of layers ``round(L/3)`` and ``round(2L/3)``."""
    pct = 100.0 * (1.0 - keep)
    if structure == "one-stage":
        return Schedule.from_layers(model, layers, {min(layers - 2, round(15 / 32 * layers)): pct})
    return Schedule.from_layers(
        model, layers, {round(layers / 3): pct, min(layers - 2, round(2 * layers / 3)): pct}
    )


def matched_keep(structure: str, rule: Scoring, model: str, dims: ModelDims, n: int, target: float) -> float:
    """The largest keep share (on a 1e-4 grid) whose FLOP speedup at ``n`` tokens reaches ``target``."""

    def speed(keep: float) -> float:
        sched = structure_schedule(structure, model, dims.num_layers, keep).with_scoring(rule)
        return flop_speedup(sched, dims, n)

    lo, hi = 0, 10_000  # keep = k / 10_000; speed falls as keep grows
    if speed(1e-4) < target:
        raise ValueError(f"{structure} cannot reach {target}x FLOP speedup at {n} tokens")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if speed(max(mid, 1) / 10_000) >= target:
            lo = mid
        else:
            hi = mid - 1
    return max(lo, 1) / 10_000


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(args.model, dtype=args.dtype)
    layers = int(model.config.num_hidden_layers)
    dims = ModelDims.from_config(model.config)
    rules = {name: Scoring.parse(name) for name in args.rules.split(",")}
    targets = [float(t) for t in args.targets.split(",")]
    splits: dict[str, tuple[Evaluator, FidelityEvaluator]] = {}
    t0 = time.monotonic()
    for split in ("validation", "test"):
        cfg = EvalSettings(
            model=args.model, task=args.task, split=split, n_examples=args.n_examples,
            max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens, data_dir=args.data_dir,
            openqa_dir=args.openqa_dir,
        )  # fmt: skip
        ev = Evaluator(model, tokenizer, cfg, out / "cache", progress=False)
        fid = FidelityEvaluator(ev, top_k=64)
        fid.references()
        splits[split] = (ev, fid)
        print(
            f"{split}: {len(ev.examples)} examples, baseline + reference ready ({time.monotonic() - t0:.0f} s)"
        )
    lengths = [len(ex.input_ids) for ev, _ in splits.values() for ex in ev.examples]
    n_mid = int(statistics.median(lengths))
    cells: list[dict[str, Any]] = []
    for target in targets:
        for structure in STRUCTURES:
            for rule_name, rule in rules.items():
                keep = matched_keep(structure, rule, args.model, dims, n_mid, target)
                sched = structure_schedule(structure, args.model, layers, keep).with_scoring(rule)
                sched = sched.with_revival(args.revival)
                engine = LazyLLM(model, sched, tokenizer=tokenizer, strict_model_name=False)
                rows: list[dict[str, Any]] = []
                for split, (ev, fid) in splits.items():
                    refs = fid.references()
                    base = None if args.kl_only else ev.baseline()
                    for ex in ev.examples:
                        drift = fid.example_drift(engine, ex, refs[ex.key])
                        row: dict[str, Any] = {
                            "split": split,
                            "dataset": ex.dataset,
                            "key": ex.key,
                            "kl": drift.kl,
                            "top1": drift.top1,
                        }
                        if base is not None:
                            pred = run_example(engine, ex).text or ""
                            row["loss"] = 100.0 * (base[ex.key].score - score_prediction(ex, pred))
                        rows.append(row)
                cell = {
                    "target": target, "structure": structure, "rule": rule_name, "scoring": str(rule),
                    "keep": keep, "percentiles": list(sched.percentiles),
                    "flop_speedup": flop_speedup(sched, dims, n_mid), "rows": rows,
                }  # fmt: skip
                cells.append(cell)
                kl = statistics.fmean(r["kl"] for r in rows)
                print(
                    f"{target:.1f}x {structure:9s} {rule_name:8s} keep {keep:.3f} "
                    f"({cell['flop_speedup']:.3f}x) mean KL {kl:.4f} [{time.monotonic() - t0:.0f} s]"
                )
    result = {
        "model": args.model,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "task": args.task,
        "max_prompt_tokens": args.max_prompt_tokens,
        "median_prompt_tokens": n_mid,
        "revival": args.revival,
        "level": args.level,
        "cells": cells,
    }
    (out / "rows.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (out / "ablation.md").write_text(text)
    print(text)
    return result


def _est(rows: list[dict[str, Any]], signal: str, level: float) -> Estimate:
    return estimate([r[signal] for r in rows], macro_weights([r["dataset"] for r in rows]), level=level)


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]], signal: str, level: float) -> Estimate:
    """Macro mean of ``b - a`` per example (the same examples in the same order)."""
    if [r["key"] for r in a] != [r["key"] for r in b]:
        raise ValueError("paired cells must hold the same examples")
    weights = macro_weights([r["dataset"] for r in a])
    return paired_estimate([r[signal] for r in b], [r[signal] for r in a], weights, level=level)


def _fmt(e: Estimate, digits: int) -> str:
    return f"{e.value:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"


def _verdict(e: Estimate, lower_is_better: bool, a: str, b: str) -> str:
    """Which side the interval of ``b - a`` favours, or that it cannot tell."""
    if e.low <= 0 <= e.high:
        return "cannot tell"
    b_better = (e.high < 0) if lower_is_better else (e.low > 0)
    return f"{b} better" if b_better else f"{a} better"


def markdown(result: dict[str, Any]) -> str:
    level = result["level"]
    cells = result["cells"]
    signals = [s for s in ("kl", "top1", "loss") if all(s in r for c in cells for r in c["rows"])]
    digits = {"kl": 3, "top1": 2, "loss": 1}
    lower_better = {"kl": True, "top1": False, "loss": True}
    rules = list(dict.fromkeys(c["rule"] for c in cells))
    spellings = {c["rule"]: c["scoring"] for c in cells}
    lines = [
        f"# Scoring ablation: {result['model']}, task {result.get('task', 'qa')}, prompts of at most "
        f"{result['max_prompt_tokens']} tokens (median {result['median_prompt_tokens']}), revival "
        f"{result['revival']}, {result.get('dtype', 'float32')}",
        "",
        f"Rules: {', '.join(f'{rule} = {spelled}' for rule, spelled in spellings.items())}. "
        f"Means are macro over datasets with {level:.0%} bootstrap intervals; KL in nats per answer token "
        "(teacher-forced), top-1 agreement as a share"
        + (
            ", task loss in LongBench points (unpruned minus pruned; lower is better)."
            if "loss" in signals
            else " (no task loss: --kl-only)."
        ),
    ]
    for split in ("validation", "test"):
        for target in dict.fromkeys(c["target"] for c in cells):
            group = [c for c in cells if c["target"] == target]
            rows = {(c["structure"], c["rule"]): [r for r in c["rows"] if r["split"] == split] for c in group}
            n = len(next(iter(rows.values())))
            lines += [
                "",
                f"## {split}, {target:.1f}x FLOP speedup (n = {n} examples)",
                "",
                "| structure | rule | keep per stage | FLOP speedup | "
                + " | ".join(SIGNALS[s] for s in signals)
                + " |",
                "|---|---|---|---|" + "---|" * len(signals),
            ]
            for c in group:
                r = rows[(c["structure"], c["rule"])]
                lines.append(
                    f"| {c['structure']} | {c['rule']} | {c['keep']:.3f} | {c['flop_speedup']:.3f}x | "
                    + " | ".join(_fmt(_est(r, s, level), digits[s]) for s in signals)
                    + " |"
                )
            lines += [
                "",
                "| paired difference (B - A) | " + " | ".join(SIGNALS[s] for s in signals) + " |",
                "|---|" + "---|" * len(signals),
            ]
            pairs = [
                ((s, rules[0]), (s, other), f"{s}: {other} - {rules[0]}")
                for s in STRUCTURES
                for other in rules[1:]
            ] + [((STRUCTURES[0], r), (STRUCTURES[1], r), f"{r}: gradual - one-stage") for r in rules]
            for a, b, label in pairs:
                cols = []
                for signal in signals:
                    e = _paired(rows[a], rows[b], signal, level)
                    names = (a[1], b[1]) if a[0] == b[0] else (a[0], b[0])
                    cols.append(f"{_fmt(e, digits[signal])} ({_verdict(e, lower_better[signal], *names)})")
                lines.append(f"| {label} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="qa", help="a task or group of tuner.search (qa, openqa, ...)")
    parser.add_argument("--openqa-dir", default=None, help="HotpotQA/SQuAD folder for the openqa tasks")
    parser.add_argument("--kl-only", action="store_true", help="skip the free-running task loss")
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--n-examples", type=int, default=1, help="examples per dataset and split")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--targets", default="1.3,1.6", help="FLOP speedups, comma-separated")
    parser.add_argument("--rules", default="last,fastkv", help="scoring rules; the first is the reference")
    parser.add_argument("--revival", default="frozen")
    parser.add_argument("--level", type=float, default=0.9, help="interval level")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--dtype", default="auto", choices=tuple(DTYPES), help="auto: float32 on CPU, bfloat16 on CUDA"
    )
    parser.add_argument("--out", default="outputs/scoring_ablation")
    args = parser.parse_args()
    run(args)


if __name__ == "__main__":
    main()

"""A finished study's held-out rows compared on teacher-forced KL on test, not only on task score.

    python benchmarks/heldout_kl.py runs/<study> [--data-dir DIR] [--threads 2] [--json PATH]

The held-out stage (``heldout.json``) compares the recommendation with the best hand-made schedules
on the test split by measured TTFT and task-score loss. With 29 test examples the task score tells
two schedules apart only when they differ by several points; the teacher-forced KL of
:mod:`tuner.evaluation.fidelity` is the low-noise signal the search itself uses. This reads the study's
``recommended.json`` and ``heldout.json``, rebuilds the test split from the study's own settings
(the study's cached baseline answers are reused), and reports for every row:

* its mean KL per answer token on test (nats, macro over datasets) with a 90% bootstrap interval;
* the paired KL difference, recommendation minus the row, on the same test examples (negative: the
  recommendation drifts less), with its 90% interval; "cannot be told apart" when it contains 0;

beside the study's own test TTFT, FLOP speedup and task-score loss. The only thing it writes into
the study folder is the test split's fidelity reference, in the study's ``cache/`` beside the test
baseline it reuses (``--json`` saves the table elsewhere).

The measured tables, dated, are in docs/statistics.md ("The held-out check").
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, Schedule, load_model
from tuner.evaluation.fidelity import ExampleDrift, FidelityEvaluator
from tuner.evaluation.runner import Evaluator
from tuner.statistics.bootstrap import estimate, macro_weights, paired_estimate
from tuner.study.handmade import families
from tuner.study.settings import EvalSettings

LEVEL = 0.9


def row_schedules(heldout: dict[str, Any], recommended: Schedule) -> dict[str, Schedule]:
    """Each ``heldout.json`` row's schedule by label: the recommendation, and the hand-made picks rebuilt
    by name from :func:`tuner.study.handmade.families` (the study's revival), checked against the
    percentiles the row recorded."""
    grids = families(recommended.model, recommended.num_layers, recommended.revival)
    out = {"recommended": recommended}
    for family, name in heldout["best_hand_made"].items():
        out[f"best {family} ({name})"] = grids[family][name]
    for row in heldout["rows"]:
        sched = out[row["schedule"]]
        if [round(p, 4) for p in sched.percentiles] != [round(p, 4) for p in row["percentiles"]]:
            raise ValueError(f"{row['schedule']}: heldout.json holds other percentiles than this code builds")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("study_dir", help="a finished study's folder (holds recommended.json and heldout.json)")
    p.add_argument(
        "--data-dir", default=None, help="LongBench folder, as given to the study (default: $LONGBENCH_DIR)"
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also save the rows here")
    args = p.parse_args(argv)
    study = Path(args.study_dir)
    missing = [n for n in ("recommended.json", "heldout.json") if not (study / n).is_file()]
    if missing:
        print(f"error: {study} has no {', '.join(missing)}: pass a finished study's folder", file=sys.stderr)
        return 2
    recommended = Schedule.load(study / "recommended.json")
    heldout = json.loads((study / "heldout.json").read_text())
    if not any(row["schedule"] == "recommended" for row in heldout["rows"]):
        print(
            f"error: {study}/heldout.json has no recommended row (the study recommended nothing)",
            file=sys.stderr,
        )
        return 2
    meta = recommended.metadata
    settings = meta["settings"]
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(meta["model"])
    cfg = EvalSettings(
        model=meta["model"], task=meta["task"], language=settings["language"], split="test",
        split_seed=settings["split_seed"], n_examples=settings["n_examples"],
        max_prompt_tokens=settings["max_prompt_tokens"], max_new_tokens=settings["max_new_tokens"],
        data_dir=args.data_dir,
    )  # fmt: skip
    evaluator = Evaluator(model, tokenizer, cfg, study / "cache", progress=True)
    fidelity = FidelityEvaluator(evaluator, top_k=int(settings["fidelity_top_k"]))
    start = time.monotonic()
    fidelity.references()
    print(f"test reference: {len(evaluator.examples)} examples, {time.monotonic() - start:.0f} s")
    schedules = row_schedules(heldout, recommended)
    drifts: dict[str, list[ExampleDrift]] = {}
    for row in heldout["rows"]:
        engine = LazyLLM(model, schedules[row["schedule"]], tokenizer=tokenizer, strict_model_name=False)
        drifts[row["schedule"]], _ = fidelity.evaluate(engine, desc=row["schedule"])
    weights = macro_weights([d.dataset for d in drifts["recommended"]])
    rec = [d.kl for d in drifts["recommended"]]
    out = []
    print(f"\n{meta['model']}, study {meta['study']}, test split, n={len(rec)}, {LEVEL:.0%} intervals")
    # what the study's held-out check timed (TTFT, whole generation, or nothing: the FLOP model);
    # files written before the field timed TTFT
    timed = {row.get("test_speedup_kind", "measured") for row in heldout["rows"]}
    names = {"measured": "TTFT", "total": "generation speedup", "flops": "FLOP speedup"}
    label = names[timed.pop()] if len(timed) == 1 else "speedup"
    print(
        f"| schedule | test {label} (FLOP) | test task loss | test KL (nats) | top-1 agreement "
        "| KL: recommended - it |"
    )
    print("|---|---|---|---|---|---|")
    for row in heldout["rows"]:
        kls = [d.kl for d in drifts[row["schedule"]]]
        kl = estimate(kls, weights, level=LEVEL)
        top1 = estimate([d.top1 for d in drifts[row["schedule"]]], weights, level=LEVEL).value
        diff = None if row["schedule"] == "recommended" else paired_estimate(rec, kls, weights, level=LEVEL)
        told = "" if diff is None or not diff.low <= 0.0 <= diff.high else " (cannot be told apart)"
        low, high = row["test_loss_interval"]
        print(
            f"| {row['schedule']} | {row['test_speedup']:.2f}x ({row['test_flop_speedup']:.2f}x) | "
            f"{row['test_loss']:.2f} [{low:.2f}, {high:.2f}] | {kl.value:.4f} [{kl.low:.4f}, {kl.high:.4f}] | "
            f"{top1:.3f} | "
            + ("-" if diff is None else f"{diff.value:+.4f} [{diff.low:+.4f}, {diff.high:+.4f}]{told}")
            + " |"
        )
        out.append({
            "schedule": row["schedule"], "test_speedup": row["test_speedup"],
            "test_flop_speedup": row["test_flop_speedup"], "test_loss": row["test_loss"],
            "test_kl": kl.to_dict(), "test_top1": top1,
            "kl_recommended_minus_it": None if diff is None else diff.to_dict(),
        })  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"study": meta["study"], "n_test": len(rec), "rows": out}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

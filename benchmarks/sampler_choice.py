"""Which Optuna sampler should tuner.search use by default? Hypervolume after N trials, over seeds.

    python benchmarks/sampler_choice.py [--trials 12] [--seeds 0 1 2] [--samplers tpe gp nsga2 random]

Cheap but real settings: SmolLM2 on the LongBench QA validation examples (one per dataset, prompts
cut to 256 tokens, 8-token answers), ``stages`` search space, FLOP-model speedup (deterministic, so
the comparison is not drowned in timing noise). Every (sampler, seed) runs its own in-memory study
with the same warm start as tuner.search. Hypervolume of (speedup, accuracy loss) is measured against
the reference point (speedup 1.0, loss = the budget), feasible trials only; higher is better.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

import optuna

from lazyllm.models import load_model
from tuner.evaluation.losses import BaselineStats, Budget
from tuner.evaluation.runner import Evaluator
from tuner.stages.trial import TrialRunner
from tuner.study.samplers import make_sampler
from tuner.study.settings import SearchSettings
from tuner.study.spaces import load_space
from tuner.study.storage import warm_start


def hypervolume(points: list[tuple[float, float]], ref_speedup: float, ref_loss: float) -> float:
    """Area dominated by ``points`` (maximise speedup, minimise loss) inside the reference box."""
    pts = sorted(
        {(s, min(loss, ref_loss)) for s, loss in points if s > ref_speedup and loss < ref_loss}, reverse=True
    )
    area, best_loss = 0.0, ref_loss
    for speed, loss in pts:  # by speedup, descending
        if loss < best_loss:
            area += (speed - ref_speedup) * (best_loss - loss)
            best_loss = loss
    return area


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--samplers", nargs="+", default=["tpe", "gp", "nsga2", "random"])
    p.add_argument("--budget", type=float, default=2.0)
    p.add_argument("--data-dir", default=os.environ.get("LONGBENCH_DIR"))
    p.add_argument("--model", default=SearchSettings.model, help="alias, checkpoint folder or hub id")
    p.add_argument(
        "--cache", type=Path, default=Path("benchmarks/results/cache"), help="baseline cache folder"
    )
    args = p.parse_args(argv)

    settings = SearchSettings(
        model=args.model, n_trials=args.trials, n_examples=1, max_prompt_tokens=256, max_new_tokens=8, speedup="flops",
        max_accuracy_loss=args.budget, data_dir=args.data_dir, tracking_uri="none",
    )  # fmt: skip
    model, tokenizer = load_model(settings.model)
    layers = int(model.config.num_hidden_layers)
    space = load_space(settings.search_space)
    evaluator = Evaluator(model, tokenizer, settings, args.cache, progress=False)
    baseline = BaselineStats.of(evaluator.baseline_results())
    runner = TrialRunner(
        settings, model, tokenizer, evaluator, space, baseline, Budget.from_settings(settings)
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    table: dict[str, list[float]] = {}
    for name in args.samplers:
        for seed in args.seeds:
            study = optuna.create_study(
                directions=["maximize", "minimize"], sampler=make_sampler(name, seed, args.trials)
            )
            warm_start(study, space, layers)
            study.optimize(runner.objective, n_trials=args.trials)
            pts = [(t.values[0], t.values[1]) for t in study.trials if t.values]
            hv = hypervolume(pts, 1.0, args.budget)
            table.setdefault(name, []).append(hv)
            print(f"{name:<7} seed {seed}: hypervolume {hv:.3f} ({len(pts)} complete trials)", flush=True)
    print(f"\n| sampler | hypervolume after {args.trials} trials (mean +- sd over seeds {args.seeds}) |")
    print("|---|---|")
    for name, hvs in sorted(table.items(), key=lambda kv: -statistics.fmean(kv[1])):
        sd = statistics.stdev(hvs) if len(hvs) > 1 else 0.0
        print(f"| {name} | {statistics.fmean(hvs):.3f} +- {sd:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

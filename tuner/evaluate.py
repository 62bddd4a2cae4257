"""Compare methods on a LongBench task split: the LazyLLM paper's Table 1 and Table 2 on our models.

    python -m tuner.evaluate --task qa --split test --schedule s.json [--preset qa] \\
        [--methods baseline,random,static,compression,lazyllm] [--data-dir DIR] [--output DIR]

Table 1: score per category (macro average of its datasets' LongBench scores) and measured TTFT
speedup, per method. Table 2: share of prompt (token, layer) pairs computed and measured generation
(total time) speedup. Both with sample counts. Table 3: each method's accuracy loss with its paired
bootstrap interval (:func:`tuner.evaluation.runner.loss_estimate`, the one bootstrap of :mod:`tuner.statistics.bootstrap`).

Speedups are measured as the search measures them (:mod:`tuner.statistics.speed`, see
:meth:`tuner.evaluation.runner.Evaluator.measure_speed`): per category, on its example of median prompt
length, ``--timing-rounds`` interleaved rounds, minimum per side, on ``--timing-clock`` (``auto``: the
CPU thread clock on a CPU); the report names the clock and the rounds.

Written as markdown, CSV and PNG under ``--output``, with per-example JSONL and a summary JSON per method (reruns overwrite). The default ``--output`` is
``outputs/evaluate/<model>-<task>-<split>``, so evaluations of different tasks never overwrite each other.

Method knobs: ``--method-options gemfilter.k=0.3,tsp.layer=14`` (validated before the model loads).
``--match-speedup`` adds the peers at the schedule's speedup and loss (:mod:`tuner.evaluation.matched`):
``matched.md``, ``matched.csv``, ``matched.png``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tuner.interrupts import interrupts_end_the_start

with interrupts_end_the_start(__name__):  # Ctrl-C while torch loads: one line
    from lazyllm.cli import cli_main
    from lazyllm.flops import ModelDims
    from lazyllm.methods import Generator, make_method, peer_names
    from lazyllm.models import load_model
    from lazyllm.schedule import Schedule
    from tuner.evaluation import matched
    from tuner.evaluation.runner import (
        EvaluationSummary,
        Evaluator,
        ExampleResult,
        MethodSpeed,
        by_category,
        summarize,
    )
    from tuner.orchestration.preflight import check_evaluate
    from tuner.redact import redact_text
    from tuner.report import evaluation as report
    from tuner.report import matched as matched_report
    from tuner.study.settings import EvaluateSettings, add_flags, settings_from_flags

COMPUTE_MATCHED = frozenset({"random", "static", "compression"})
"""Baselines built to compute what the schedule computes (:mod:`lazyllm.methods`): the FLOP model
their measured speedup is checked against is the schedule's."""


def time_method(
    settings: EvaluateSettings,
    evaluator: Evaluator,
    method: str,
    generator: Generator,
    schedule: Schedule | None,
) -> dict[str, MethodSpeed]:
    """Category (and ``"all"``) -> the method's measured speedups on that category's timing example
    (:meth:`Evaluator.timing_example`); an example shared by several categories is timed once."""
    dims = ModelDims.from_config(evaluator.model.config)
    options = settings.options_by_method.get(method, {})
    reference = "lazyllm" if method in COMPUTE_MATCHED else method
    timed: dict[str, MethodSpeed] = {}
    out: dict[str, MethodSpeed] = {}
    for category, examples in by_category(evaluator.examples).items():
        ex = evaluator.timing_example(examples)
        if ex.key not in timed:
            flops = matched.median_flop_speedup(reference, options, schedule, dims, [len(ex.input_ids)])
            timed[ex.key] = evaluator.measure_speed(
                generator, ex, flops, rounds=settings.timing_rounds, clock=settings.timing_clock
            )
        out[category] = timed[ex.key]
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tuner.evaluate", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--preset", help="YAML preset: a name under studies/ (e.g. qa) or a path")
    add_flags(p, EvaluateSettings)
    return p


def settings_from_args(args: argparse.Namespace) -> EvaluateSettings:
    return settings_from_flags(args, EvaluateSettings)


def evaluate(settings: EvaluateSettings) -> int:
    """Evaluate every method of ``settings`` and write the report; returns 0."""
    schedule = check_evaluate(settings)  # schedule file and data: before the model loads, before any write
    out = settings.out_dir
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(
        settings.model, dtype=settings.dtype, trust_remote_code=settings.trust_remote_code
    )
    if schedule is not None:
        schedule.check_model(
            settings.model, int(model.config.num_hidden_layers), strict_name=not settings.allow_other_model
        )
    evaluator = Evaluator(model, tokenizer, settings.eval_only(), out / "cache")
    baseline = evaluator.baseline_results()
    results: dict[str, list[ExampleResult]] = {}
    speeds: dict[str, dict[str, MethodSpeed]] = {}
    summaries: dict[str, EvaluationSummary] = {}
    options = settings.options_by_method
    for method in settings.method_list:
        if settings.match_speedup and method in peer_names():
            continue  # run by the matched comparison, at matched knobs and along its sweep
        if method == "baseline":
            res = baseline
        else:
            generator = make_method(
                method, model, tokenizer, schedule, seed=settings.seed, options=options.get(method)
            )
            res, _ = evaluator.evaluate(method, generator)
            speeds[method] = time_method(settings, evaluator, method, generator, schedule)
        results[method] = res
        summaries[method] = summarize(res, baseline, speeds.get(method, {}).get("all"))
        report.write_method(res, summaries[method], out, method)
    text = report.write_report(
        out, report.header(settings, len(evaluator.examples), schedule), results, speeds, summaries
    )
    if settings.match_speedup and schedule is not None:
        # the tuned schedule's results from above (same examples, schedule and seed) are reused
        known = (
            {"lazyllm": matched.Evaluated(results["lazyllm"], speeds["lazyllm"]["all"])}
            if "lazyllm" in results and not options.get("lazyllm")
            else {}
        )
        found = matched.run(settings, evaluator, schedule, baseline, known)
        text += "\n" + matched_report.write(
            found, settings.out_dir, matched_report.header(settings), matched_report.title(settings)
        )
    print(text)
    print(f"written: {out}/{report.WRITTEN}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return cli_main(_parser(), lambda args: evaluate(settings_from_args(args)), argv, redact=redact_text)


if __name__ == "__main__":
    sys.exit(main())

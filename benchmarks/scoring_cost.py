"""Where the time of task-scoring one example goes: prefill, decode steps, stop rule; and a trial.

    python benchmarks/scoring_cost.py [--task openqa] [--n-examples 3] [--max-prompt-tokens 1024]
        [--openqa-dir DIR] [--data-dir DIR] [--out benchmarks/data/scoring_cost-<date>.json]

On ``n_examples`` validation examples per dataset of ``--task`` (built by the product,
:func:`tuner.evaluation.runner.build_examples`), for the unpruned model and the paper-style schedule
(:meth:`lazyllm.Schedule.paper_style`), each example is generated greedily as the evaluation
generates it (:meth:`lazyllm.methods.Generator.generate`, the dataset's answer length capped at 32
and its stop rule) and once more without a stop string, reading the engine's own TTFT (prefill +
first token), total time, tokens generated and finish reason: decode per step is
``(total - ttft) / (new tokens - 1)``. Then the same examples go through the product's stages as a
study runs them, timed: the baseline (:meth:`Evaluator.baseline`), the fidelity references, one
fidelity trial of the paper-style schedule (:meth:`FidelityEvaluator.evaluate`) and one task-scored
pass (:meth:`Evaluator.evaluate`, its examples decoded together by :func:`lazyllm.generate_batch`,
then one at a time for comparison, counting identical answers), and the confirmation's three schedules with their KLs, one at a
time against example by example from one captured prefix each
(:meth:`FidelityEvaluator.score_together`). Wall seconds on whatever the machine does meanwhile (the CPU is
shared): read ratios, not absolute values. Writes a dated JSON with every row.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.methods import make_method
from tuner.evaluation.fidelity import FidelityEvaluator
from tuner.evaluation.runner import Evaluator, Example, build_examples, run_example, score_prediction
from tuner.study.settings import EvalSettings


def run_one(generator: Any, ex: Example, stop: bool) -> dict[str, Any]:
    result = generator.generate(
        torch.tensor(ex.input_ids),
        max_new_tokens=ex.max_new_tokens,
        stop_strings=ex.stop_strings if stop else (),
    )
    n = len(result.token_ids)
    t0 = time.perf_counter()
    score = score_prediction(ex, result.text or "")  # the evaluation's own scoring (classes, metric)
    return {
        "example": ex.key,
        "prompt_tokens": len(ex.input_ids),
        "stop_rule": bool(stop and ex.stop_strings),
        "ttft_s": result.ttft_s,
        "total_s": result.total_s,
        "new_tokens": n,
        "decode_s_per_step": (result.total_s - result.ttft_s) / (n - 1) if n > 1 else 0.0,
        "finish_reason": result.finish_reason,
        "score": score,
        "metric_s": time.perf_counter() - t0,
        "text": result.text,
    }


def summary(rows: list[dict[str, Any]]) -> str:
    def mean(key: str) -> float:
        return statistics.fmean(float(r[key]) for r in rows)

    reasons = ", ".join(
        f"{k} {sum(r['finish_reason'] == k for r in rows)}" for k in ("stop_string", "eos", "length")
    )
    return (
        f"prefill+1st {mean('ttft_s'):6.2f} s | decode {mean('total_s') - mean('ttft_s'):6.2f} s "
        f"({mean('new_tokens'):4.1f} tokens, {1000 * mean('decode_s_per_step'):5.0f} ms/step) | "
        f"total {mean('total_s'):6.2f} s | score {100 * mean('score'):5.1f} | finish: {reasons}"
    )


def timed(fn: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--task", default="openqa")
    p.add_argument("--n-examples", type=int, default=3, help="validation examples per dataset")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--openqa-dir", default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--threads", type=int, default=2, help="torch threads (1 on a CPU others share)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, device="cpu")
    layers = int(model.config.num_hidden_layers)
    schedule = Schedule.paper_style(args.model, layers).with_revival("frozen")
    config = EvalSettings(
        model=args.model, task=args.task, split="validation", n_examples=args.n_examples,
        max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=32,
        data_dir=args.data_dir, openqa_dir=args.openqa_dir,
    )  # fmt: skip
    examples, build_s = timed(lambda: build_examples(config, tokenizer))
    print(
        f"{len(examples)} examples of {args.task} at {args.max_prompt_tokens} tokens built in {build_s:.1f} s"
    )

    generators = {
        "baseline": make_method("baseline", model, tokenizer, None),
        "paper-style": make_method("lazyllm", model, tokenizer, schedule),
    }
    rows: list[dict[str, Any]] = []
    for name, gen in generators.items():
        run_one(gen, examples[0], True)  # warm-up, not recorded
        for stop in (True, False):
            part = [{"method": name, **run_one(gen, ex, stop)} for ex in examples]
            rows += part
            print(f"{name:12s} {'stop at newline' if stop else 'no stop string':16s} {summary(part)}")

    with tempfile.TemporaryDirectory() as cache:
        ev, ev_s = timed(lambda: Evaluator(model, tokenizer, config, cache, progress=False))
        _, base_s = timed(ev.baseline)
        fid = FidelityEvaluator(ev)
        _, ref_s = timed(fid.references)
        engine = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)
        _, trial_s = timed(lambda: fid.evaluate(engine))
        # one task-scored pass: the examples decoded together (what the evaluation runs), then one
        # at a time as before; the answers must be the same
        (batched, _), scored_s = timed(lambda: ev.evaluate("lazyllm", generators["paper-style"]))
        alone, alone_scored_s = timed(
            lambda: [run_example(generators["paper-style"], ex) for ex in ev.examples]
        )
        same = sum(r.prediction == (a.text or "") for r, a in zip(batched, alone))
        # the confirmation's k = 3 schedules with their KLs on a larger set (no prefix cached): one at a
        # time, as before, then example by example from one captured prefix each (score_together)
        three = {
            i: LazyLLM(model, s.with_revival("frozen"), tokenizer=tokenizer, strict_model_name=False)
            for i, s in enumerate(
                (schedule, Schedule.from_layers(args.model, layers, {layers // 2: 50}),
                 Schedule.from_layers(args.model, layers, {layers // 4: 30, layers // 2: 30}))
            )
        }  # fmt: skip
        cold = FidelityEvaluator(ev, prefix_bytes=0)
        cold.references()
        _, alone_s = timed(lambda: [(ev.evaluate("lazyllm", e), cold.evaluate(e)) for e in three.values()])
        _, together_s = timed(lambda: cold.score_together(three, kl=True))
    n = len(examples)
    stages = {
        "build_s": build_s,
        "evaluator_s": ev_s,
        "baseline_s_per_example": base_s / n,
        "fidelity_reference_s_per_example": ref_s / n,
        "fidelity_trial_s_per_example": trial_s / n,
        "task_scored_s_per_example": scored_s / n,
        "task_scored_one_at_a_time_s_per_example": alone_scored_s / n,
        "task_scored_same_answers": same,
        "confirm_3_schedules_alone_s_per_example": alone_s / n,
        "confirm_3_schedules_together_s_per_example": together_s / n,
    }
    print("per example, as a study runs them: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))

    out = Path(args.out or f"benchmarks/data/scoring_cost-{dt.date.today().isoformat()}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"date": dt.datetime.now().isoformat(timespec="seconds"), **vars(args), "n": n, "layers": layers}
    out.write_text(json.dumps({"meta": meta, "stages": stages, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

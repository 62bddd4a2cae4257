"""Which accuracy signal should the search optimise? Reliability, validity and CPU cost per signal.

    python benchmarks/objective_noise.py [--max-prompt-tokens 1024] [--schedules all] [--max-minutes 11]
        [--revival frozen] [--no-gold] [--grid stages|rules] [--test-score-only]

For a set of schedules (``--grid stages``: 20 spanning the ``stages`` space with today's rule, keep-all
to aggressive; ``--grid rules``: 14 with today's rule and FastKV's on the shapes a 1024-token study
puts on its front) and every English QA record (validation and test), measures per schedule and
example (``--test-score-only``: on test only the task score, what ``benchmarks/decision_rule.py``
replays against):

* ``score``: the LongBench task-score loss (baseline score - pruned score, points), free-running;
* ``kl``: teacher-forced mean KL(unpruned || pruned) per answer token (:mod:`tuner.evaluation.fidelity`);
* ``1-top1``: teacher-forced top-1 disagreement;
* ``gold``: change in gold-answer log-likelihood per token;

and the CPU seconds (``time.process_time``) each took. Results are appended per schedule to
``<out>/rows.jsonl`` and a rerun continues where it stopped (``--max-minutes`` ends a run between
schedules), so the full evidence can be gathered in several short runs.

Reported (``--report``):

* **split-half reliability**: for each of 500 random splits of the examples into two halves
  (stratified by dataset), the Spearman correlation of the schedules' mean losses on one half with
  those on the other; the median and 10-90% range over splits;
* **validity**: Spearman correlation of each signal's schedule means on *validation* with the task-
  score loss on *test*;
* **CPU seconds per trial** at the study's default (every validation example), per signal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.flops import ModelDims, flop_speedup
from tuner.evaluation.fidelity import FidelityEvaluator
from tuner.evaluation.runner import Evaluator, run_example, score_prediction
from tuner.statistics.bootstrap import estimate, macro_weights, spearman
from tuner.study.settings import EvalSettings

SIGNALS = ("score", "kl", "1-top1", "gold")


def schedules(model: str, layers: int) -> dict[str, Schedule]:
    """Schedules from keep-all to aggressive, defined on fractions of the depth (30 layers: as named)."""

    def at(frac: float) -> int:
        return min(layers - 2, round(frac * layers))

    return {
        "keep-all": Schedule.keep_all(model, layers),
        "50% after L20": Schedule.from_layers(model, layers, {at(2 / 3): 50}),
        "85% after L12, 50% L18, 40% L24": Schedule.from_layers(
            model, layers, {at(0.4): 85, at(0.6): 50, at(0.8): 40}
        ),
        "paper-style": Schedule.paper_style(model, layers),
        "45% after L0, 90% after L6": Schedule.from_layers(model, layers, {0: 45, at(0.2): 90}),
        "70% after L15": Schedule.from_layers(model, layers, {at(1 / 2): 70}),
        "90% after L15": Schedule.from_layers(model, layers, {at(1 / 2): 90}),
        "progressive from L7 to 10%": Schedule.progressive(
            model, layers, start_layer=at(0.23), final_keep=0.1, stages=4
        ),
        "30% after L10, 30% after L20": Schedule.from_layers(model, layers, {at(1 / 3): 30, at(2 / 3): 30}),
        "50% after L4": Schedule.from_layers(model, layers, {at(0.13): 50}),
        "20% after L25": Schedule.from_layers(model, layers, {at(0.83): 20}),
        "90% after L25": Schedule.from_layers(model, layers, {at(0.83): 90}),
        "30% after L15": Schedule.from_layers(model, layers, {at(1 / 2): 30}),
        "50% after L10": Schedule.from_layers(model, layers, {at(1 / 3): 50}),
        "80% after L10": Schedule.from_layers(model, layers, {at(1 / 3): 80}),
        "20% after L2": Schedule.from_layers(model, layers, {at(0.07): 20}),
        "60% after L20, 60% after L25": Schedule.from_layers(model, layers, {at(2 / 3): 60, at(0.83): 60}),
        "40% after L8, 40% L16, 40% L24": Schedule.from_layers(
            model, layers, {at(0.27): 40, at(0.53): 40, at(0.8): 40}
        ),
        "progressive from L15 to 30%": Schedule.progressive(
            model, layers, start_layer=at(1 / 2), final_keep=0.3, stages=3
        ),
        "progressive from L3 to 5%": Schedule.progressive(
            model, layers, start_layer=at(0.1), final_keep=0.05, stages=5
        ),
    }


def rule_schedules(model: str, layers: int) -> dict[str, Schedule]:
    """Schedules across the scoring rules (``--grid rules``): today's rule and FastKV's on the shapes a
    1024-token study puts on its front (one stage at mid depth, gradual, multi-stage), plus keep-all
    and paper-style; layers as fractions of depth (30 layers: as named)."""

    def at(frac: float) -> int:
        return min(layers - 2, round(frac * layers))

    def fastkv(prune_at: dict[int, float]) -> Schedule:
        return Schedule.from_layers(model, layers, prune_at).with_scoring("fastkv")

    tsp = at(14 / 30)  # TSP's layer on SmolLM2 (lazyllm.peers.tsp: round(15 / 32 * L))
    return {
        "keep-all": Schedule.keep_all(model, layers),
        "paper-style": Schedule.paper_style(model, layers),
        "50% after L15": Schedule.from_layers(model, layers, {at(1 / 2): 50}),
        "25% after L15": Schedule.from_layers(model, layers, {at(1 / 2): 25}),
        "40% after L8, 40% L15, 40% L22": Schedule.from_layers(
            model, layers, {at(0.27): 40, at(1 / 2): 40, at(0.73): 40}
        ),
        "30% after L10, 30% after L20": Schedule.from_layers(model, layers, {at(1 / 3): 30, at(2 / 3): 30}),
        "fastkv 40% after L14": fastkv({tsp: 40}),
        "fastkv 60% after L14": fastkv({tsp: 60}),
        "fastkv 70% after L14": fastkv({tsp: 70}),
        "fastkv 80% after L14": fastkv({tsp: 80}),
        "fastkv 70% after L15": fastkv({at(1 / 2): 70}),
        "fastkv 30% after L8, 30% L15, 30% L22": fastkv({at(0.27): 30, at(1 / 2): 30, at(0.73): 30}),
        "fastkv 10% L5, 15% L8, 30% L10, 35% L15": fastkv(
            {at(1 / 6): 10, at(0.27): 15, at(1 / 3): 30, at(1 / 2): 35}
        ),
        "fastkv 50% after L22": fastkv({at(0.73): 50}),
        # the default study's recommendation (seeds 0 and 1, 2026-12-01)
        "fastkv 30% L6, 50% L15, 50% L17": fastkv({at(0.2): 30, at(1 / 2): 50, at(17 / 30): 50}),
    }


GRIDS = {"stages": schedules, "rules": rule_schedules}


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows_path = out / "rows.jsonl"
    done = set()
    if rows_path.exists():
        done = {json.loads(line)["schedule"] for line in rows_path.read_text().splitlines() if line}
    torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model)
    layers = int(model.config.num_hidden_layers)
    grid = GRIDS[args.grid](args.model, layers)
    wanted = list(grid) if args.schedules == "all" else [s.strip() for s in args.schedules.split(";")]
    start = time.monotonic()
    evs = {}
    for split in ("validation", "test"):
        cfg = EvalSettings(
            model=args.model, task="qa", split=split, n_examples=args.n_examples, max_prompt_tokens=args.max_prompt_tokens,
            max_new_tokens=args.max_new_tokens, data_dir=args.data_dir,
        )  # fmt: skip
        ev = Evaluator(model, tokenizer, cfg, out / "cache", progress=False)
        fid = FidelityEvaluator(ev, top_k=64, gold=True)
        t0 = time.process_time()
        if split == "validation" or not args.test_score_only:
            fid.references()  # baseline generation + reference (once, cached)
        else:
            ev.baseline()
        print(
            f"{split}: {len(ev.examples)} examples, baseline+reference {time.process_time() - t0:.0f} CPU s"
        )
        evs[split] = (ev, fid)
    dims = ModelDims.from_config(model.config)
    for name in wanted:
        if name in done:
            continue
        if args.max_minutes and (time.monotonic() - start) / 60 > args.max_minutes:
            print(f"stopping before {name!r}: --max-minutes reached; rerun to continue")
            break
        sched = grid[name].with_revival(args.revival)
        engine = LazyLLM(model, sched, tokenizer=tokenizer, strict_model_name=False)
        examples: list[dict[str, Any]] = []
        for split, (ev, fid) in evs.items():
            base = ev.baseline()
            score_only = split == "test" and args.test_score_only
            refs = {} if score_only else fid.references()
            for ex in ev.examples:
                c0 = time.process_time()
                pred = run_example(engine, ex).text or ""
                c1 = time.process_time()
                if score_only:  # what benchmarks/decision_rule.py reads of the test split
                    examples.append(
                        {"split": split, "dataset": ex.dataset, "key": ex.key,
                         "score": 100.0 * (base[ex.key].score - score_prediction(ex, pred)),
                         "kl": None, "1-top1": None, "gold": None, "cpu_score": c1 - c0,
                         "cpu_fidelity": None, "cpu_gold": None, "prompt_tokens": len(ex.input_ids)}
                    )  # fmt: skip
                    continue
                ref = refs[ex.key]
                no_gold = dataclasses.replace(ref, gold_ids=ref.gold_ids[:0], gold_logp=ref.gold_logp[:0])
                kl_drift = fid.example_drift(engine, ex, no_gold)
                c2 = time.process_time()
                full = fid.example_drift(engine, ex, ref) if args.gold and ref.gold_ids.numel() else None
                c3 = time.process_time()
                examples.append(
                    {
                        "split": split,
                        "dataset": ex.dataset,
                        "key": ex.key,
                        "score": 100.0 * (base[ex.key].score - score_prediction(ex, pred)),
                        "kl": kl_drift.kl,
                        "1-top1": 1.0 - kl_drift.top1,
                        "gold": None if full is None else full.gold_delta,
                        "cpu_score": c1 - c0,
                        "cpu_fidelity": c2 - c1,
                        # the gold pass alone (the full call repeats the KL pass)
                        "cpu_gold": None if full is None else (c3 - c2) - (c2 - c1),
                        "prompt_tokens": len(ex.input_ids),
                    }
                )
        n_prompt = round(statistics.fmean(e["prompt_tokens"] for e in examples))
        row = {
            "schedule": name,
            "percentiles": list(sched.percentiles),
            "scoring": str(sched.scoring),
            "flop_speedup": flop_speedup(sched, dims, n_prompt),
            "max_prompt_tokens": args.max_prompt_tokens,
            "revival": str(sched.revival),
            "examples": examples,
        }
        with rows_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        means = {
            s: statistics.fmean(e[s] for e in examples if e[s] is not None)
            for s in SIGNALS
            if examples[0][s] is not None
        }
        print(
            f"{name:34s} flops {row['flop_speedup']:.2f}x "
            + " ".join(f"{s} {v:.4f}" for s, v in means.items())
        )


def macro(examples: list[dict[str, Any]], signal: str) -> float:
    by: dict[str, list[float]] = {}
    for e in examples:
        by.setdefault(e["dataset"], []).append(e[signal])
    return statistics.fmean(statistics.fmean(v) for v in by.values())


def report(args: argparse.Namespace) -> dict[str, Any]:
    rows = [json.loads(line) for line in (Path(args.out) / "rows.jsonl").read_text().splitlines() if line]
    keys = [e["key"] for e in rows[0]["examples"]]
    datasets = {e["key"]: e["dataset"] for e in rows[0]["examples"]}
    rng = random.Random(0)
    out: dict[str, Any] = {"n_schedules": len(rows), "n_examples": len(keys), "signals": {}}
    lines = [
        f"{len(rows)} schedules x {len(keys)} examples, prompts <= {rows[0]['max_prompt_tokens']} tokens",
        "",
        "| signal | split-half Spearman, median (10-90%) over 500 splits | validity: validation signal vs test score loss | CPU s / example |",
        "|---|---|---|---|",
    ]
    by_dataset: dict[str, list[str]] = {}
    for k in keys:
        by_dataset.setdefault(datasets[k], []).append(k)
    splits = []
    for _ in range(500):
        half: set[str] = set()
        for ks in by_dataset.values():
            shuffled = ks[:]
            rng.shuffle(shuffled)
            half.update(shuffled[: len(ks) // 2 + (rng.random() < 0.5 if len(ks) % 2 else 0)])
        splits.append(half)
    test_loss = [macro([e for e in r["examples"] if e["split"] == "test"], "score") for r in rows]
    for signal in SIGNALS:
        if any(e[signal] is None for r in rows for e in r["examples"]):
            lines.append(f"| {signal} | not measured on every schedule (--no-gold) | | |")
            continue
        rhos = []
        for half in splits:
            a = [macro([e for e in r["examples"] if e["key"] in half], signal) for r in rows]
            b = [macro([e for e in r["examples"] if e["key"] not in half], signal) for r in rows]
            rho = spearman(a, b)
            if rho == rho:
                rhos.append(rho)
        rhos.sort()
        val = [macro([e for e in r["examples"] if e["split"] == "validation"], signal) for r in rows]
        validity = spearman(val, test_loss)
        cpu_key = {"score": "cpu_score", "gold": "cpu_gold"}.get(signal, "cpu_fidelity")
        cpu = statistics.fmean(e[cpu_key] for r in rows for e in r["examples"])
        qs = [rhos[min(len(rhos) - 1, int(p * len(rhos)))] if rhos else float("nan") for p in (0.5, 0.1, 0.9)]
        out["signals"][signal] = {
            "split_half_median": qs[0], "split_half_p10": qs[1], "split_half_p90": qs[2],
            "validity": validity, "cpu_s_per_example": cpu,
        }  # fmt: skip
        lines.append(f"| {signal} | {qs[0]:.2f} ({qs[1]:.2f} to {qs[2]:.2f}) | {validity:.2f} | {cpu:.2f} |")
    lines += [
        "",
        "| schedule | FLOP speedup | validation KL (90% interval) | validation score loss | test score loss (90% interval) |",
        "|---|---|---|---|---|",
    ]
    for r, tl in zip(rows, test_loss):
        v_examples = [e for e in r["examples"] if e["split"] == "validation"]
        t_examples = [e for e in r["examples"] if e["split"] == "test"]
        kl = estimate([e["kl"] for e in v_examples], macro_weights([e["dataset"] for e in v_examples]))
        tl_est = estimate([e["score"] for e in t_examples], macro_weights([e["dataset"] for e in t_examples]))
        lines.append(
            f"| {r['schedule']} | {r['flop_speedup']:.2f} | {kl.value:.4f} ({kl.low:.4f} to {kl.high:.4f}) | "
            f"{macro(v_examples, 'score'):.2f} | {tl:.2f} ({tl_est.low:.2f} to {tl_est.high:.2f}) |"
        )
    print("\n".join(lines))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--n-examples", type=int, default=None, help="examples per split (default: all)")
    p.add_argument("--schedules", default="all", help="'all' or names separated by ';'")
    p.add_argument("--max-minutes", type=float, default=11.0, help="stop between schedules after this")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--revival", default="frozen", help="decoding revival policy (the study's default: frozen)"
    )
    p.add_argument(
        "--gold", action=argparse.BooleanOptionalAction, default=True, help="also the gold-likelihood pass"
    )
    p.add_argument("--grid", default="stages", choices=sorted(GRIDS), help="which set of schedules")
    p.add_argument(
        "--test-score-only",
        action="store_true",
        help="on test, only the task score (what benchmarks/decision_rule.py replays against)",
    )
    p.add_argument("--out", default="outputs/objective_noise")
    p.add_argument("--report", action="store_true", help="only print the tables from the saved rows")
    args = p.parse_args(argv)
    if not args.report:
        run(args)
    result = report(args)
    (Path(args.out) / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

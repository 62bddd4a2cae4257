"""What a search trial costs: teacher-forced drift step by step, in one pass, and resumed from the prefix.

    python benchmarks/trial_cost.py [--model smollm2-135m] [--max-prompt-tokens 1024] [--data-dir DIR]

A trial of the default study (``--accuracy fidelity``, ``frozen`` revival) teacher-forces every
validation example through the pruned model (:mod:`tuner.evaluation.fidelity`). With ``frozen`` revival the
decoding steps prune nothing, so :meth:`lazyllm.engine.LazyLLM.forced_logits` runs all forced
tokens after the prefill as one pass; before, it walked the layers once per answer token. And with
the unpruned prefill of each prompt kept (:meth:`~lazyllm.engine.LazyLLM.capture_prefix`, once per
example and study) a prefill starts at the schedule's first pruning layer. For a few schedules of
the ``stages`` space this times the paths side by side on the same examples (wall seconds for all
of them, the order rotating per schedule) and reports the largest difference in per-example KL
from the step-by-step path (float rounding only; resuming adds none to the one pass).

The measured table, dated, is in docs/benchmarks.md ("Trial cost").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from lazyllm import LazyLLM, Schedule, load_model
from lazyllm.flops import ModelDims, flop_speedup
from tuner.evaluation.fidelity import FidelityEvaluator, drift
from tuner.evaluation.runner import Evaluator
from tuner.study.settings import EvalSettings


def grid(model: str, layers: int) -> dict[str, Schedule]:
    def at(frac: float) -> int:
        return min(layers - 2, round(frac * layers))

    return {
        "keep-all": Schedule.keep_all(model, layers),
        "paper-style": Schedule.progressive(model, layers, start_layer=at(0.25), final_keep=0.3, stages=4),
        "fastkv 60% after the middle": Schedule.from_layers(model, layers, {at(0.47): 60}).with_scoring("fastkv"),
        "40% after each quarter": Schedule.from_layers(model, layers, {at(0.27): 40, at(0.5): 40, at(0.73): 40}),
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--n-examples", type=int, default=None, help="validation examples (default: all)")
    p.add_argument(
        "--max-new-tokens", type=int, default=EvalSettings.max_new_tokens, help="answer length cap"
    )
    p.add_argument("--cache", default="trial-cost-cache", help="baseline and reference cache folder")
    args = p.parse_args(argv)
    model, tokenizer = load_model(args.model)
    layers = int(model.config.num_hidden_layers)
    cfg = EvalSettings(model=args.model, task="qa", split="validation", n_examples=args.n_examples,
                       max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
                       data_dir=args.data_dir)  # fmt: skip
    ev = Evaluator(model, tokenizer, cfg, Path(args.cache), progress=False)
    fid = FidelityEvaluator(ev)
    refs = fid.references()
    dims = ModelDims.from_config(model.config)
    answer = sum(int(r.answer_ids.shape[0]) for r in refs.values()) / len(refs)
    print(f"{args.model}: {len(ev.examples)} examples, {args.max_prompt_tokens}-token prompts, "
          f"answers of {answer:.1f} tokens on average; frozen revival")  # fmt: skip
    t0 = time.perf_counter()
    prefixes = {ex.key: fid.prefix(ex) for ex in ev.examples}
    held = sum(p.nbytes for p in prefixes.values() if p is not None) / 2**20
    print(f"prefixes: captured in {time.perf_counter() - t0:.1f} s, {held:.0f} MiB held")
    print("| schedule | FLOP speedup | step by step (s) | one pass (s) | one pass from the prefix (s) "
          "| ratio to step by step | max abs KL difference |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for i, (name, sched) in enumerate(grid(args.model, layers).items()):
        engine = LazyLLM(model, sched.with_revival("frozen"), tokenizer=tokenizer, strict_model_name=False)
        paths = {
            "steps": lambda ids, answer, key, e=engine: e._forced_steps(ids, answer),
            "one pass": lambda ids, answer, key, e=engine: e._forced_one_pass(ids, answer),
            "prefix": lambda ids, answer, key, e=engine: e._forced_one_pass(ids, answer, prefixes[key]),
        }
        order = list(paths)[i % 3 :] + list(paths)[: i % 3]
        seconds, kls = {}, {}
        for path in order:
            t0, got = time.perf_counter(), []
            with torch.inference_mode():
                for ex in ev.examples:
                    ref = refs[ex.key]
                    ids = torch.as_tensor(ex.input_ids)[None]
                    got.append(drift(ref, paths[path](ids, ref.answer_ids.tolist(), ex.key))[0])
            seconds[path], kls[path] = time.perf_counter() - t0, got
        diff = max(abs(a - b) for path in ("one pass", "prefix") for a, b in zip(kls["steps"], kls[path]))
        speed = flop_speedup(sched, dims, args.max_prompt_tokens)
        print(f"| {name} | {speed:.2f}x | {seconds['steps']:.1f} | {seconds['one pass']:.1f} | "
              f"{seconds['prefix']:.1f} | {seconds['steps'] / seconds['one pass']:.2f} / "
              f"{seconds['steps'] / seconds['prefix']:.2f} | {diff:.1e} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

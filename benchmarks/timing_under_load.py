"""Does the measured TTFT speedup survive a busy machine? A real CPU hog in another process.

    python benchmarks/timing_under_load.py [--tokens 1024] [--repeats 3]

Per schedule: the quiet reference is ``tuner.speed.measure_speedup`` with 15 rounds and no other
load (run it under the shared CPU lock). Then a hog process starts (busy loops in bursts: on for
0.2-1.0 s, off for 0.2-1.0 s, on one core), and the speedup is measured again ``--repeats`` times
for each number of rounds in ``--rounds``, with

* ``robust``: :func:`tuner.speed.measure_speedup` (interleaved, minimum per side, FLOP check);
* ``paired-median``: the statistic the search used before, the median over rounds of per-round
  ``baseline / schedule`` ratios.

Reported: the worst relative error against the quiet value over the repeats (target: robust within
10%), and the wall seconds per measurement, which decide ``--timing-rounds``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from lazyllm import LazyLLM, ModelDims, Schedule, flop_speedup, load_model
from tuner.speed import measure_speedup, prefill_timer

HOG = """
import random, time
rng = random.Random(0)
while True:
    end = time.monotonic() + rng.uniform(0.2, 1.0)
    while time.monotonic() < end:
        pass
    time.sleep(rng.uniform(0.2, 1.0))
"""


def main() -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, nargs="+", default=[1, 3, 5])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    model, _ = load_model(args.model)
    layers = int(model.config.num_hidden_layers)
    dims = ModelDims.from_config(model.config)
    ids = torch.randint(
        100, model.config.vocab_size - 100, (args.tokens,), generator=torch.Generator().manual_seed(0)
    )
    base = LazyLLM(model, Schedule.keep_all(args.model, layers))
    scheds = {
        "paper-style": Schedule.paper_style(args.model, layers),
        "70% after L15": Schedule.from_layers(args.model, layers, {layers // 2: 70}),
        "45% after L0, 90% after L6": Schedule.from_layers(args.model, layers, {0: 45, layers // 5: 90}),
    }
    base_timer = prefill_timer(base, ids)
    base_timer()  # warm-up
    results = []
    quiet: dict[str, float] = {}
    for name, s in scheds.items():
        flops = flop_speedup(s, dims, args.tokens)
        timer = prefill_timer(LazyLLM(model, s), ids)
        timer()
        quiet[name] = measure_speedup(base_timer, timer, flops, rounds=15).speedup
        print(f"{name}: quiet {quiet[name]:.3f}x (FLOP model {flops:.3f}x)", flush=True)
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        time.sleep(1.0)
        for name, s in scheds.items():
            flops = flop_speedup(s, dims, args.tokens)
            timer = prefill_timer(LazyLLM(model, s), ids)
            for rounds in args.rounds:
                errs_robust, errs_median, walls = [], [], []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    m = measure_speedup(base_timer, timer, flops, rounds=rounds)
                    walls.append(time.perf_counter() - t0)
                    errs_robust.append(m.speedup / quiet[name] - 1)
                    pairs = [(base_timer(), timer()) for _ in range(rounds)]
                    errs_median.append(statistics.median(b / t for b, t in pairs) / quiet[name] - 1)
                row = {
                    "schedule": name,
                    "rounds": rounds,
                    "quiet": quiet[name],
                    "flop": flops,
                    "robust_worst_err": max(errs_robust, key=abs),
                    "paired_median_worst_err": max(errs_median, key=abs),
                    "wall_s": statistics.fmean(walls),
                }
                results.append(row)
                print(
                    f"{name:28s} rounds {rounds}: robust worst {row['robust_worst_err']:+.1%}, "
                    f"paired-median worst {row['paired_median_worst_err']:+.1%}, {row['wall_s']:.1f} s/measurement",
                    flush=True,
                )
    finally:
        hog.kill()
        hog.wait()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

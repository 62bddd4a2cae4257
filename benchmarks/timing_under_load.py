"""Does the measured TTFT speedup survive a busy machine? A real CPU hog in another process.

    python benchmarks/timing_under_load.py [--tokens 1024] [--rounds 3] [--repeats 3] [--hogs 1 2]

Per schedule, the **quiet reference** is what a user sees on an idle machine: the wall-clock
speedup (process's usual threads, :func:`tuner.statistics.speed.measure_speedup`, 9 rounds), measured first
with nothing else running. Then ``--hogs`` hog processes start (each a busy loop in bursts: on for
0.2-1.0 s, off for 0.2-1.0 s) and the speedup is measured ``--repeats`` times per clock:

* ``cpu``: the tuner's default on a CPU (:func:`tuner.statistics.speed.resolve_clock`): one thread, that
  thread's CPU time, ``--rounds`` interleaved rounds, minimum per side;
* ``wall``: the same statistic on the wall clock with the usual threads (the tuner before).

Reported per schedule, hog count and clock: the worst relative error against the quiet reference
over the repeats (target: within 10%) and the wall seconds one measurement took.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from lazyllm import LazyLLM, ModelDims, Schedule, flop_speedup, load_model
from tuner.statistics.speed import measure_speedup, prefill_timer

HOG = """
import random, time
rng = random.Random(0)
while True:
    end = time.monotonic() + rng.uniform(0.2, 1.0)
    while time.monotonic() < end:
        pass
    time.sleep(rng.uniform(0.2, 1.0))
"""


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3, help="rounds per measurement under load")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--hogs", type=int, nargs="+", default=[1, 2], help="hog processes, one run each")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
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
    engines = {name: LazyLLM(model, s) for name, s in scheds.items()}
    flops = {name: flop_speedup(s, dims, args.tokens) for name, s in scheds.items()}
    prefill_timer(base, ids)()  # warm-up
    quiet: dict[str, float] = {}
    print(f"{args.tokens}-token prompt, {torch.get_num_threads()} threads", flush=True)
    for name, engine in engines.items():
        prefill_timer(engine, ids)()
        m = measure_speedup(prefill_timer(base, ids), prefill_timer(engine, ids), flops[name], rounds=9)
        quiet[name] = m.speedup
        print(
            f"{name}: quiet wall-clock reference {quiet[name]:.3f}x (FLOP model {flops[name]:.3f}x)",
            flush=True,
        )
    results = []
    for n_hogs in args.hogs:
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(n_hogs)]
        try:
            time.sleep(1.0)
            for name, engine in engines.items():
                for clock in ("cpu", "wall"):
                    errors, walls = [], []
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        m = measure_speedup(
                            prefill_timer(base, ids, clock),
                            prefill_timer(engine, ids, clock),
                            flops[name],
                            rounds=args.rounds,
                            clock=clock,
                        )
                        walls.append(time.perf_counter() - t0)
                        errors.append(m.speedup / quiet[name] - 1)
                    row = {
                        "schedule": name, "hogs": n_hogs, "clock": clock, "rounds": args.rounds,
                        "quiet": quiet[name], "flop": flops[name], "errors": errors,
                        "worst_error": max(errors, key=abs), "wall_s": statistics.fmean(walls),
                    }  # fmt: skip
                    results.append(row)
                    print(
                        f"{name:28s} hogs {n_hogs} clock {clock:4s}: errors "
                        + " ".join(f"{e:+.1%}" for e in errors)
                        + f" (worst {row['worst_error']:+.1%}), {row['wall_s']:.1f} s/measurement",
                        flush=True,
                    )
        finally:
            for h in hogs:
                h.kill()
                h.wait()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

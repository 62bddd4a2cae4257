"""Serving throughput: N concurrent clients against the OpenAI-compatible server and MLflow's pyfunc server.

    python benchmarks/serve_throughput.py [--model smollm2-135m] [--schedule s.json] [--clients 1 4 8 16]
        [--requests 4] [--prompt-tokens 512] [--max-tokens 32] [--targets tuned unpruned pyfunc]
        [--device cpu] [--dtype auto] [--out benchmarks/data/serve_throughput.<date>.<device>.json]

GPU variant (a lent machine): ``--device cuda --dtype bfloat16``.

Targets, each a real server subprocess on 127.0.0.1 driven over HTTP:

* ``tuned``: ``python -m lazyllm.serve`` with the schedule (default: the paper-style progressive
  schedule with ``frozen`` revival, which batches), streamed chat completions;
* ``unpruned``: the same server, the same requests with ``"schedule": "unpruned"``;
* ``pyfunc``: ``mlflow models serve`` of the schedule saved as MLflow's pyfunc model
  (:func:`tuner.tracking.serving.save_model`), the same chat bodies at ``/invocations``. MLflow's
  scoring server cannot stream, so its "TTFT" is the whole answer's latency; it generates one request
  at a time per worker (``--pyfunc-workers``, default 1).

Each of ``--clients`` N closed-loop clients (threads) sends ``--requests`` requests one after the
other; every request is a different LongBench context (multi_news) cut to ``--prompt-tokens`` tokens
asking for at most ``--max-tokens`` greedy tokens. Per (target, N): requests per second and output
tokens per second over the wall time from the first request to the last answer, TTFT p50/p95 (time
to the first streamed text chunk, measured by the client), and for the server's targets the mean
batch size its answers report. Untimed warm-up per target: one request, then one round at each
client count (the first batch of a size pays one-off set-up that would swamp the rows).

Rows go to ``--out`` (one JSON file per date and device, rewritten on a rerun) and a markdown table
is printed. Timing on a shared machine measures the machine's load as well: say so with the numbers.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support import free_port, stop_process_group, wait_for_http  # noqa: E402


@dataclass(frozen=True)
class Row:
    """One (target, clients) measurement."""

    date: str
    machine: str
    device: str
    dtype: str
    model: str
    target: str
    clients: int
    requests: int
    prompt_tokens: int
    max_tokens: int
    wall_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p95_s: float
    mean_batch_size: float | None


@dataclass(frozen=True)
class Answer:
    ttft_s: float
    completion_tokens: int
    batch_size: int | None


def prompts(tokenizer: Any, n: int, tokens: int) -> list[str]:
    """``n`` different LongBench multi_news contexts, each cut to ``tokens`` tokens, as text."""
    data = Path(os.environ.get("LONGBENCH_DIR", ROOT.parent / "shared/data/longbench"))
    out: list[str] = []
    with (data / "multi_news.jsonl").open() as fh:
        for line in fh:
            ids = tokenizer(json.loads(line)["context"])["input_ids"]
            if len(ids) >= tokens:
                out.append(tokenizer.decode(ids[:tokens]) + "\n\nSummarize the text above in one sentence.")
            if len(out) == n:
                return out
    raise ValueError(
        f"multi_news has fewer than {n} contexts of {tokens}+ tokens; lower --requests or --prompt-tokens"
    )


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (linear interpolation between order statistics)."""
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def ask_server(base: str, model: str, schedule: str, max_tokens: int) -> Callable[[str], Answer]:
    """One streamed chat completion through the official client (TTFT: the first text chunk)."""
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=3600)

    def ask(prompt: str) -> Answer:
        t0 = time.perf_counter()
        ttft = None
        tokens, batch = 0, None
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body={"schedule": schedule},
        )  # fmt: skip
        for chunk in stream:
            if ttft is None and chunk.choices and chunk.choices[0].delta.content:
                ttft = time.perf_counter() - t0
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
            extension = (chunk.model_extra or {}).get("lazyllm")
            if extension:
                batch = int(extension["batch_size"])
        return Answer(ttft if ttft is not None else time.perf_counter() - t0, tokens, batch)

    return ask


def ask_pyfunc(base: str, max_tokens: int) -> Callable[[str], Answer]:
    """One chat body at MLflow's ``/invocations`` (no streaming: TTFT is the whole latency)."""

    def ask(prompt: str) -> Answer:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
        request = urllib.request.Request(
            base + "/invocations",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        t0 = time.perf_counter()
        with urllib.request.urlopen(request, timeout=3600) as resp:
            answer = json.loads(resp.read())
        return Answer(time.perf_counter() - t0, int(answer["usage"]["completion_tokens"]), None)

    return ask


def drive(
    ask: Callable[[str], Answer], texts: list[str], clients: int, per_client: int
) -> tuple[float, list[Answer]]:
    """``clients`` threads, each asking its ``per_client`` prompts in turn; the wall time and every answer."""
    answers: list[Answer] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        try:
            for j in range(per_client):
                got = ask(texts[(k * per_client + j) % len(texts)])
                with lock:
                    answers.append(got)
        except BaseException as exc:  # reported after the join
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"a client failed: {errors[0]!r}")
    return wall, answers


@contextmanager
def server(cmd: list[str], log: Path, health: str, env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    full = [*cmd, "--host", "127.0.0.1", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(full, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        try:
            wait_for_http(base + health, proc, log, what=" ".join(cmd[:4]), timeout=900)
            yield base
        finally:
            stop_process_group(proc)


def table(rows: list[Row]) -> str:
    lines = [
        "| target | clients | requests | req/s | output tok/s | TTFT p50 s | TTFT p95 s | mean batch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        batch = "-" if r.mean_batch_size is None else f"{r.mean_batch_size:.1f}"
        lines.append(f"| {r.target} | {r.clients} | {r.requests} | {r.requests_per_s:.2f} | "
                     f"{r.output_tokens_per_s:.1f} | {r.ttft_p50_s:.2f} | {r.ttft_p95_s:.2f} | {batch} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--schedule", type=Path, help="schedule JSON (default: paper-style, frozen revival)")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--requests", type=int, default=4, help="requests per client (default: %(default)s)")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--targets", nargs="+", default=["tuned", "unpruned", "pyfunc"],
                        choices=["tuned", "unpruned", "pyfunc"])  # fmt: skip
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--pyfunc-workers", type=int, default=1)
    parser.add_argument(
        "--out", type=Path, help="default: benchmarks/data/serve_throughput.<date>.<device>.json"
    )
    args = parser.parse_args()

    from transformers import AutoConfig, AutoTokenizer

    from lazyllm.models import resolve
    from lazyllm.schedule import Schedule
    from tuner.tracking.serving import save_model

    source, _ = resolve(args.model)
    layers = int(AutoConfig.from_pretrained(source).num_hidden_layers)
    schedule = (
        Schedule.load(args.schedule)
        if args.schedule
        else Schedule.paper_style(args.model, layers).with_revival("frozen")
    )
    most = max(args.clients) * args.requests
    texts = prompts(AutoTokenizer.from_pretrained(source), most + 1, args.prompt_tokens)
    warm, texts = texts[0], texts[1:]
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    machine = f"{platform.machine()} {os.cpu_count()} cores, {platform.system()}"
    rows: list[Row] = []

    def measure(target: str, ask: Callable[[str], Answer]) -> None:
        ask(warm)
        for n in args.clients:  # untimed: the first batch of each size pays one-off kernel set-up
            drive(ask, [warm] * n, n, 1)
        for n in args.clients:
            wall, answers = drive(ask, texts, n, args.requests)
            batches = [a.batch_size for a in answers if a.batch_size is not None]
            row = Row(
                date=date, machine=machine, device=args.device, dtype=args.dtype, model=args.model,
                target=target, clients=n, requests=len(answers), prompt_tokens=args.prompt_tokens,
                max_tokens=args.max_tokens, wall_s=wall, requests_per_s=len(answers) / wall,
                output_tokens_per_s=sum(a.completion_tokens for a in answers) / wall,
                ttft_p50_s=percentile([a.ttft_s for a in answers], 0.5),
                ttft_p95_s=percentile([a.ttft_s for a in answers], 0.95),
                mean_batch_size=statistics.fmean(batches) if batches else None,
            )  # fmt: skip
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)

    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        file = schedule.save(Path(tmp) / "schedule.json")
        served = [t for t in args.targets if t != "pyfunc"]
        if served:
            cmd = [sys.executable, "-m", "lazyllm.serve", "--model", args.model, "--schedule", f"tuned={file}",
                   "--max-batch", str(max(args.clients)), "--max-queue", str(4 * most),
                   "--device", args.device, "--dtype", args.dtype, "--served-model-name", "bench"]  # fmt: skip
            with server(cmd, Path(tmp) / "serve.log", "/health") as base:
                for target in served:
                    measure(target, ask_server(base, "bench", target, args.max_tokens))
        if "pyfunc" in args.targets:
            folder = save_model(schedule, Path(tmp) / "model", base_model=args.model)
            path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
            cmd = [sys.executable, "-m", "mlflow", "models", "serve", "-m", str(folder), "--env-manager", "local",
                   "--workers", str(args.pyfunc_workers)]  # fmt: skip
            with server(cmd, Path(tmp) / "pyfunc.log", "/ping", env={"PATH": path}) as base:
                measure("pyfunc", ask_pyfunc(base, args.max_tokens))

    out = args.out or ROOT / "benchmarks" / "data" / f"serve_throughput.{date}.{args.device}.json"
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    out.write_text(json.dumps({"settings": settings, "schedule": json.loads(schedule.to_json()),
                               "rows": [asdict(r) for r in rows]}, indent=1) + "\n")  # fmt: skip
    print(f"\n{table(rows)}\n\nwrote {out}")


if __name__ == "__main__":
    main()

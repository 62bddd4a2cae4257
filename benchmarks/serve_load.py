"""Load test of ``python -m lazyllm.serve`` with GuideLLM (a standard tool: it drives the server as
any OpenAI client would and measures what vLLM's and TGI's users compare): concurrent streams at
each ``--streams`` level, for the tuned schedule and the unpruned model through the same server.

    python benchmarks/serve_load.py --schedule benchmarks/data/search-sqrt-2026-12-05/longbench-seed0/recommended.json \\
        [--model smollm2-135m] [--streams 1 4 8 16] [--requests 24] [--prompt-tokens 512] \\
        [--output-tokens 32] [--guidellm /tmp/guidellm-venv/bin/guidellm] [--out benchmarks/data/serving-<date>]

GuideLLM lives in its own virtual environment (``python -m venv /tmp/guidellm-venv &&
/tmp/guidellm-venv/bin/pip install guidellm``: it needs no torch), so the project's own stays as it
is. Requests are GuideLLM's synthetic prompts of ``--prompt-tokens`` tokens (by the model's own
tokenizer) to ``/v1/completions``, streamed, each asking for exactly ``--output-tokens`` tokens
(``ignore_eos``), greedy; the unpruned rows send ``"schedule": "unpruned"``. Per (target, streams):
requests/s, output tokens/s, TTFT p50/p95 and inter-token latency p50, GuideLLM's own numbers from its
JSON report. Before the runs, an untimed warm-up: one request, then one round of the largest stream
count, for each target (a first batch of a shape pays one-off set-up). Writes
``--out``/<target>.scenario.json, <target>.json (GuideLLM's report, raw), the server's log and
``table.md``; timing on a shared machine measures its load too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support import served  # noqa: E402

TARGETS = {"tuned": {}, "unpruned": {"schedule": "unpruned"}}


def scenario(base: str, model: str, tokenizer: str, streams: list[int], args: argparse.Namespace,
             body: dict[str, Any], report: Path) -> dict[str, Any]:  # fmt: skip
    """GuideLLM's scenario: one sub-benchmark per stream count."""
    return {
        "metadata": {"name": f"lazyllm-{report.stem}", "description": "lazyllm.serve load test"},
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": base,
                "model": model,
                "request_format": "/v1/completions",
                "extras": {"body": {"temperature": 0, **body}},
            },
            "profile": {"kind": "concurrent"},
            "tokenizer": {"kind": "huggingface_auto", "model": tokenizer},
            "data": [
                {
                    "kind": "synthetic_text",
                    "prompt_tokens": args.prompt_tokens,
                    "output_tokens": args.output_tokens,
                }
            ],
            "constraints": [{"kind": "max_requests", "count": args.requests}],
            "outputs": [{"kind": "json", "path": str(report)}],
        },
        "benchmarks": [{"profile.streams": n} for n in streams],
    }


def warm_up(base: str, model: str, body: dict[str, Any], streams: int, args: argparse.Namespace) -> None:
    """One request, then ``streams`` at once (untimed)."""
    words = " ".join(f"word{i}" for i in range(args.prompt_tokens // 2))
    data = json.dumps({"model": model, "prompt": words, "max_tokens": args.output_tokens, "temperature": 0,
                       "ignore_eos": True, **body}).encode()  # fmt: skip

    def ask(_: int) -> None:
        request = urllib.request.Request(base + "/v1/completions", data=data,
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=600) as resp:
            resp.read()

    ask(0)
    with ThreadPoolExecutor(streams) as pool:
        list(pool.map(ask, range(streams)))


def _get(tree: Any, *path: str) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def rows(report: Path) -> list[dict[str, Any]]:
    """(streams, requests/s, output tok/s, TTFT p50/p95 ms, ITL p50 ms) per sub-benchmark."""
    data = json.loads(report.read_text())
    out = []
    for bench in data["benchmarks"]:
        metrics = bench["metrics"]
        stat = "successful"
        out.append({
            "streams": _get(bench, "config", "strategy", "streams"),
            "requests": _get(metrics, "request_totals", stat),
            "requests_per_s": _get(metrics, "requests_per_second", stat, "mean"),
            "output_tokens_per_s": _get(metrics, "output_tokens_per_second", stat, "mean"),
            "ttft_p50_ms": _get(metrics, "time_to_first_token_ms", stat, "percentiles", "p50"),
            "ttft_p95_ms": _get(metrics, "time_to_first_token_ms", stat, "percentiles", "p95"),
            "itl_p50_ms": _get(metrics, "inter_token_latency_ms", stat, "percentiles", "p50"),
        })  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--schedule", required=True, type=Path)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--requests", type=int, default=24, help="requests per stream level")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--output-tokens", type=int, default=32)
    parser.add_argument("--guidellm", default="/tmp/guidellm-venv/bin/guidellm")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "data" / f"serving-{dt.date.today()}"
    )
    args = parser.parse_args()
    from lazyllm.models import prepare_packaged

    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = str(prepare_packaged(args.model))
    server = ["--model", args.model, "--schedule", f"tuned={args.schedule}", "--device", args.device,
              "--max-batch", str(max(args.streams)), "--max-queue", "256"]  # fmt: skip
    table: dict[str, list[dict[str, Any]]] = {}
    with served("lazyllm.serve", server, args.out / "server.log") as base:
        for body in TARGETS.values():
            warm_up(base, args.model, body, max(args.streams), args)
        for target, body in TARGETS.items():
            report = args.out / f"{target}.json"
            file = args.out / f"{target}.scenario.json"
            file.write_text(
                json.dumps(scenario(base, args.model, tokenizer, args.streams, args, body, report), indent=2)
            )
            env = {**os.environ, "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING"}
            subprocess.run([args.guidellm, "run", "-c", str(file), "--disable-console-interactive"],
                           check=True, env=env)  # fmt: skip
            table[target] = rows(report)
    machine = f"{platform.node()}, {os.cpu_count()} CPUs, {args.device}"
    lines = [f"{dt.date.today()}, {machine}; {args.model}, schedule {args.schedule}; {args.prompt_tokens}-token "
             f"prompts, {args.output_tokens} output tokens, {args.requests} requests per level", "",
             "| target | streams | requests/s | output tok/s | TTFT p50 (ms) | TTFT p95 (ms) | ITL p50 (ms) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for target, measured in table.items():
        for r in measured:
            lines.append(f"| {target} | {r['streams']} | {r['requests_per_s']:.2f} | {r['output_tokens_per_s']:.1f} | "
                         f"{r['ttft_p50_ms']:.0f} | {r['ttft_p95_ms']:.0f} | {r['itl_p50_ms']:.1f} |")  # fmt: skip
    for target, measured in table.items():
        one = next((r for r in measured if r["streams"] == 1), None)
        eight = next((r for r in measured if r["streams"] == 8), None)
        if one and eight:
            lines.append(f"\n{target}: 8 streams serve {eight['requests_per_s'] / one['requests_per_s']:.2f}x "
                         "the requests/s of 1 (sequential)")  # fmt: skip
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

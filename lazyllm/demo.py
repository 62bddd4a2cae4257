"""LazyLLM prefill demo: TTFT and next token with and without a pruning schedule.

    python -m lazyllm.demo                      # default model, built-in ~2k-token needle prompt
    python -m lazyllm.demo --schedule s.json --prompt-file doc.txt

Timings are paired: each round runs the transformers forward, the engine with nothing pruned and the
engine with the schedule back to back, and speedups are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from lazyllm.cli import cli_main
from lazyllm.engine import LazyLLM
from lazyllm.flops import ModelDims, flop_speedup
from lazyllm.models import DEFAULT_MODEL, load_model
from lazyllm.schedule import Schedule
from lazyllm.timing import paired_ratio, timed

_FILLER = [
    "The committee met on a grey morning to discuss the budget for the coming year.",
    "Rivers in the northern valley freeze for nearly four months every winter.",
    "A small bakery on the corner sells rye bread and almond pastries.",
    "The library extended its opening hours during the examination period.",
    "Several species of migratory birds rest on the lake in early spring.",
    "Engineers replaced the old wooden bridge with a steel structure last decade.",
    "The village council approved a plan to plant trees along the main road.",
    "Most visitors arrive by train and walk the last mile to the museum.",
]


def needle_prompt(tokenizer: Any, n_tokens: int, seed: int = 0) -> tuple[str, str]:
    """A haystack of about ``n_tokens`` tokens with one fact hidden in it; returns (prompt, answer)."""
    rng = random.Random(seed)
    code = str(rng.randint(1000, 9999))
    needle = f"The secret access code for the archive room is {code}."
    sentences: list[str] = []
    while len(tokenizer(" ".join(sentences))["input_ids"]) < n_tokens:
        sentences.append(rng.choice(_FILLER))
    sentences.insert(int(len(sentences) * 0.4), needle)
    question = "What is the secret access code for the archive room? Answer with the number only."
    return " ".join(sentences) + "\n\n" + question, code


def encode(tokenizer: Any, text: str, chat: bool) -> torch.Tensor:
    """Token ids ``[1, N]``; with ``chat`` and a chat template, the text is the user turn."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            return_dict=True,
            return_tensors="pt",
        )["input_ids"]
        return torch.as_tensor(ids).reshape(1, -1)
    return torch.as_tensor(tokenizer(text)["input_ids"]).reshape(1, -1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lazyllm.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="alias, checkpoint folder or hub id (default: %(default)s)"
    )
    parser.add_argument(
        "--schedule", type=Path, help="schedule JSON (default: a paper-style progressive schedule)"
    )
    parser.add_argument(
        "--prompt-file", type=Path, help="prompt text (default: a built-in needle-in-a-haystack prompt)"
    )
    parser.add_argument(
        "--tokens", type=int, default=2048, help="length of the built-in prompt (default: %(default)s)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="paired timing rounds (default: %(default)s)")
    parser.add_argument("--no-chat", action="store_true", help="do not apply the chat template")
    return cli_main(parser, _demo, argv)


def _demo(args: argparse.Namespace) -> int:
    if args.rounds < 1 or args.tokens < 16:
        raise ValueError(
            f"--rounds {args.rounds} / --tokens {args.tokens}: need rounds >= 1 and tokens >= 16"
        )
    model, tokenizer = load_model(args.model)
    layers = model.config.num_hidden_layers
    schedule = Schedule.load(args.schedule) if args.schedule else Schedule.paper_style(args.model, layers)
    pruned = LazyLLM(model, schedule)
    if args.prompt_file:
        try:
            text, answer = args.prompt_file.read_text(), None
        except OSError as exc:
            raise ValueError(f"cannot read --prompt-file {args.prompt_file}: {exc.strerror}") from None
    else:
        text, answer = needle_prompt(tokenizer, args.tokens)

    ids = encode(tokenizer, text, chat=not args.no_chat).to(pruned.device)
    n = ids.shape[1]
    full = LazyLLM(model, Schedule.keep_all(schedule.model, layers), strict_model_name=False)

    def hf() -> torch.Tensor:
        with torch.inference_mode():
            return model(ids, logits_to_keep=1).logits[:, -1]

    runs = {
        "transformers": hf,
        "lazyllm keep-all": lambda: full.prefill(ids).logits,
        "lazyllm schedule": lambda: pruned.prefill(ids).logits,
    }
    hf()  # warm-up
    times: dict[str, list[float]] = {k: [] for k in runs}
    tokens: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            logits, seconds = timed(fn, pruned.device)
            times[name].append(seconds)
            tokens[name] = int(logits[0].argmax())

    print(
        f"model {args.model} ({layers} layers), prompt {n} tokens"
        + (f", hidden answer {answer}" if answer else "")
    )
    print(
        f"schedule: prunes after layers {[i for i, p in enumerate(schedule.percentiles) if p > 0]}, "
        f"{100 * sum(schedule.keep_counts(n)) / (n * layers):.1f}% of prompt tokens computed"
    )
    print(f"{'run':<18} {'TTFT s (median)':>16} {'next token':>14}")
    for name in runs:
        print(f"{name:<18} {statistics.median(times[name]):>16.3f} {tokenizer.decode([tokens[name]])!r:>14}")
    speedup = paired_ratio(times["transformers"], times["lazyllm schedule"])
    overhead = paired_ratio(times["lazyllm keep-all"], times["transformers"])
    print(
        f"TTFT speedup {speedup:.2f}x (FLOP model {flop_speedup(schedule, ModelDims.from_config(model.config), n):.2f}x); "
        f"keep-all time / transformers time {overhead:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

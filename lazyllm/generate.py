"""Generate with a LazyLLM schedule from the command line.

    python -m lazyllm.generate --model smollm2-135m --schedule s.json --prompt-file f.txt \\
        --max-new-tokens 64 [--compare]

Prints the answer, TTFT, total time, decode ms/token, the revival policy, the scoring rule and the share of prompt
tokens computed; with ``--compare`` also the unpruned answer and the speedups (one unpruned run and
one pruned run, after a warm-up). ``--revival frozen`` (or ``dynamic``, ``budget:N``) overrides the
schedule's revival policy; ``--scoring fastkv`` (or any :class:`~lazyllm.scoring.Scoring` spelling) its
scoring rule. Without overrides the engine uses the schedule file's own (its ``scoring`` field).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lazyllm.cli import cli_main
from lazyllm.engine import GenerationResult, LazyLLM
from lazyllm.models import DEFAULT_MODEL, load_model
from lazyllm.schedule import Revival, Schedule


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lazyllm.generate", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="alias, checkpoint folder or hub id (default: %(default)s)"
    )
    parser.add_argument(
        "--schedule", type=Path, help="schedule JSON (default: Schedule.paper_style for the model)"
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt-file", type=Path, help="file holding the prompt text")
    source.add_argument("--prompt", help="the prompt text itself")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="default: %(default)s")
    parser.add_argument(
        "--revival", help="revival policy instead of the schedule's: dynamic, frozen or budget:N"
    )
    parser.add_argument(
        "--scoring",
        help="scoring rule instead of the schedule's: last, fastkv, gemfilter or w<W>-<softmax|raw>-...",
    )
    parser.add_argument(
        "--stop", action="append", default=[], help="stop string (repeatable), e.g. --stop $'\\n'"
    )
    parser.add_argument("--no-chat", action="store_true", help="raw prompt: do not apply the chat template")
    parser.add_argument("--compare", action="store_true", help="also run unpruned and print the speedups")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow a hub model's own Python code"
    )
    parser.add_argument(
        "--allow-other-model",
        action="store_true",
        help="use a schedule made for another model of the same depth",
    )
    return parser


def _report(label: str, result: GenerationResult) -> None:
    print(f"--- {label} ---")
    print(result.text if result.text is not None else result.token_ids)
    decode = result.decode_ms_per_token
    print(
        f"TTFT {result.ttft_s:.3f} s, total {result.total_s:.3f} s, "
        f"decode {'-' if decode is None else f'{decode:.1f}'} ms/token, {len(result.token_ids)} tokens "
        f"({result.finish_reason}), revival {result.revival}, scoring {result.scoring}, prompt {result.prompt_tokens} tokens, "
        f"{100 * result.prompt_computed_fraction:.1f}% of prompt (token, layer) pairs computed"
    )


def main(argv: list[str] | None = None) -> int:
    return cli_main(_parser(), _generate, argv)


def _preflight(args: argparse.Namespace) -> tuple[str, Schedule | None]:
    """Every input checked before the model loads: answer length, prompt, schedule file, revival.
    Returns the prompt text and the schedule (None = the paper-style default, made once the depth is known)."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens {args.max_new_tokens}: must be >= 1")
    if args.prompt_file is not None:
        source = f"--prompt-file {args.prompt_file}"
        try:
            text = args.prompt_file.read_bytes().decode("utf-8-sig")
        except OSError as exc:
            raise ValueError(f"cannot read {source}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            raise ValueError(f"{source} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    else:
        source, text = "--prompt", args.prompt
    if not text.strip():
        raise ValueError(f"{source} is empty or only whitespace; give the text to answer")
    if args.revival:
        Revival.parse(args.revival)
    if args.schedule is None:
        return text, None
    if not args.schedule.is_file():
        raise ValueError(f"--schedule {args.schedule}: no such file; pass a schedule JSON")
    return text, Schedule.load(args.schedule)


def _generate(args: argparse.Namespace) -> int:
    text, loaded = _preflight(args)
    model, tokenizer = load_model(args.model, trust_remote_code=args.trust_remote_code)
    layers = int(model.config.num_hidden_layers)
    schedule = loaded if loaded is not None else Schedule.paper_style(args.model, layers)
    if args.revival:
        schedule = schedule.with_revival(args.revival)
    if args.scoring:
        schedule = schedule.with_scoring(args.scoring)
    engine = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=not args.allow_other_model)
    chat = not args.no_chat and bool(getattr(tokenizer, "chat_template", None))
    kwargs = dict(max_new_tokens=args.max_new_tokens, chat=chat, stop_strings=args.stop)
    if args.compare:
        full = LazyLLM(
            model, Schedule.keep_all(schedule.model, layers), tokenizer=tokenizer, strict_model_name=False
        )
        full.generate(text, **{**kwargs, "max_new_tokens": 1})  # warm-up
        baseline = full.generate(text, **kwargs)
    pruned = engine.generate(text, **kwargs)
    _report("LazyLLM", pruned)
    if args.compare:
        _report("unpruned", baseline)
        print(
            f"TTFT speedup {baseline.ttft_s / pruned.ttft_s:.2f}x, total speedup "
            f"{baseline.total_s / pruned.total_s:.2f}x, same answer: {baseline.token_ids == pruned.token_ids}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

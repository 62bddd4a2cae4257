"""Generate with a LazyLLM schedule from the command line.

    python -m lazyllm.generate --model smollm2-135m --schedule s.json --prompt-file f.txt \\
        --max-new-tokens 64 [--compare]

Prints the answer, TTFT, total time, decode ms/token, the revival policy, the scoring rule and the share of prompt
tokens computed; with ``--compare`` also the unpruned answer and the speedups (one unpruned run and
one pruned run, after a warm-up). ``--revival frozen`` (or ``dynamic``, ``budget:N``) overrides the
schedule's revival policy; ``--scoring fastkv`` (or any :class:`~lazyllm.scoring.Scoring` spelling) its
scoring rule. Without overrides the engine uses the schedule file's own (its ``scoring`` field).

Decoding is greedy unless ``--do-sample`` (with ``--temperature``, ``--top-k``, ``--top-p``,
``--seed``; ``--repetition-penalty`` applies to greedy decoding too), with transformers' meaning
(:mod:`lazyllm.sampling`). ``--stream`` prints the answer as it is decoded, then the same report.
The prompt becomes the user turn of the model's chat template when the tokenizer has one (the
default of the Python API and of a served schedule too); ``--no-chat`` sends the raw text.
``--device`` (default: CUDA when there is one) and ``--dtype`` (default ``auto``: float32 on CPU,
bfloat16 on CUDA) say where and in what precision the model runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from lazyllm.cli import cli_main
from lazyllm.engine import GenerationResult, LazyLLM
from lazyllm.models import DEFAULT_MODEL, DTYPES, load_model
from lazyllm.sampling import Sampling
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
    parser.add_argument(
        "--no-chat",
        action="store_true",
        help="raw prompt: do not apply the chat template (default: applied when the tokenizer has one)",
    )
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available, else cpu)")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=tuple(DTYPES),
        help="weights and activations (default: %(default)s = float32 on CPU, bfloat16 on CUDA)",
    )
    decoding = parser.add_argument_group("decoding (transformers' names and meaning; default greedy)")
    decoding.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding")
    decoding.add_argument("--temperature", type=float, help="sampling temperature (default 1.0)")
    decoding.add_argument("--top-k", type=int, help="keep the k most likely tokens (default 50; 0: off)")
    decoding.add_argument("--top-p", type=float, help="nucleus sampling mass (default 1.0: off)")
    decoding.add_argument("--repetition-penalty", type=float, help="default 1.0: off")
    decoding.add_argument("--seed", type=int, help="seed of the sampling (default: a fresh one)")
    parser.add_argument("--stream", action="store_true", help="print the answer as it is decoded")
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


def _report(label: str, result: GenerationResult, *, streamed: bool = False) -> None:
    if not streamed:
        print(f"--- {label} ---")
        print(result.text if result.text is not None else result.token_ids)
    decode = result.decode_ms_per_token
    print(
        f"TTFT {result.ttft_s:.3f} s, total {result.total_s:.3f} s, "
        f"decode {'-' if decode is None else f'{decode:.1f}'} ms/token, {len(result.token_ids)} tokens "
        f"({result.finish_reason}), revival {result.revival}, scoring {result.scoring}, prompt {result.prompt_tokens} tokens, "
        f"{100 * result.prompt_computed_fraction:.1f}% of prompt (token, layer) pairs computed, "
        f"{'sampled' if result.sampling.do_sample else 'greedy'}"
    )


def main(argv: list[str] | None = None) -> int:
    return cli_main(_parser(), _generate, argv)


def _sampling(args: argparse.Namespace) -> Sampling:
    return Sampling.resolve(
        None, do_sample=args.do_sample or None, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
    )  # fmt: skip


def _preflight(args: argparse.Namespace) -> tuple[str, Schedule | None, Sampling]:
    """Every input checked before the model loads: answer length, prompt, schedule file, revival,
    decoding. Returns the prompt text, the schedule (None = the paper-style default, made once the
    depth is known) and the decoding strategy."""
    sampling = _sampling(args)
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
    _check_device(args.device)
    if args.schedule is None:
        return text, None, sampling
    if not args.schedule.is_file():
        raise ValueError(f"--schedule {args.schedule}: no such file; pass a schedule JSON")
    return text, Schedule.load(args.schedule), sampling


def _check_device(device: str | None) -> None:
    """A device torch knows and this machine has, before the model loads."""
    if device is None:
        return
    try:
        where = torch.device(device)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device {device}: unknown; give cpu, cuda or cuda:N") from None
    if where.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: this machine has no CUDA device; give --device cpu")
    if where.type == "cuda" and where.index is not None and where.index >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA device(s)")


def _generate(args: argparse.Namespace) -> int:
    text, loaded, sampling = _preflight(args)
    model, tokenizer = load_model(
        args.model, device=args.device, dtype=args.dtype, trust_remote_code=args.trust_remote_code
    )
    layers = int(model.config.num_hidden_layers)
    schedule = loaded if loaded is not None else Schedule.paper_style(args.model, layers)
    if args.revival:
        schedule = schedule.with_revival(args.revival)
    if args.scoring:
        schedule = schedule.with_scoring(args.scoring)
    engine = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=not args.allow_other_model)
    chat = False if args.no_chat else None  # None: the template when the tokenizer has one
    kwargs: dict[str, Any] = dict(
        max_new_tokens=args.max_new_tokens, chat=chat, stop_strings=args.stop, generation_config=sampling
    )
    if args.compare:
        full = LazyLLM(
            model, Schedule.keep_all(schedule.model, layers), tokenizer=tokenizer, strict_model_name=False
        )
        full.generate(text, **{**kwargs, "max_new_tokens": 1})  # warm-up
        baseline = full.generate(text, **kwargs)
    if args.stream:
        print("--- LazyLLM ---")
        stream = engine.stream(text, **kwargs)
        for piece in stream:
            print(piece, end="", flush=True)
        print()
        pruned = stream.result
    else:
        pruned = engine.generate(text, **kwargs)
    _report("LazyLLM", pruned, streamed=args.stream)
    if args.compare:
        _report("unpruned", baseline)
        print(
            f"TTFT speedup {baseline.ttft_s / pruned.ttft_s:.2f}x, total speedup "
            f"{baseline.total_s / pruned.total_s:.2f}x, same answer: {baseline.token_ids == pruned.token_ids}"
        )
    weights = next(model.parameters())
    print(f"model {args.model} on {weights.device.type}, {str(weights.dtype).removeprefix('torch.')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

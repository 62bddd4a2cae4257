"""Write a random-init checkpoint folder shaped like a real model, for timing where its weights cannot go.

    python benchmarks/random_checkpoint.py --like FOLDER --out FOLDER [--set hidden_size=4096 ...] [--seed 0]

Prefill and decoding speed depend on the model's shapes, not on its weight values: a schedule keeps a
fixed share of the prompt per layer whatever the scores say. So a timing machine that cannot receive a
checkpoint (the lent GPU machine takes 64 MiB; SmolLM2-135M alone is 94 MB as GGUF) can time a model of
the same shape, or of a larger one (``--set`` overrides any config field). The folder holds the config
of ``--like`` with the overrides, weights from the architecture's own initialiser (seeded), and the
tokenizer of ``--like``: ``load_model(out)`` reads it like any checkpoint. Built on CUDA when there is
one, where an 8B model initialises in seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value``; the value is read as JSON (numbers, booleans, null, lists), else kept as text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise SystemExit(f"error: --set {text!r}: expected key=value, e.g. --set hidden_size=4096")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--like", type=Path, required=True, help="checkpoint folder: config and tokenizer")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    args = parser.parse_args(argv)
    if not (args.like / "config.json").is_file():
        raise SystemExit(f"error: --like {args.like}: no config.json there; pass a checkpoint folder")
    overrides = dict(parse_override(o) for o in args.overrides)
    config = AutoConfig.from_pretrained(args.like, local_files_only=True)
    unknown = sorted(k for k in overrides if not hasattr(config, k))
    if unknown:
        raise SystemExit(f"error: --set {', '.join(unknown)}: not fields of {type(config).__name__}")
    for key, value in overrides.items():
        setattr(config, key, value)
    tokenizer = AutoTokenizer.from_pretrained(args.like, local_files_only=True)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with device:
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    print(f"{args.out}: random {type(model).__name__}, {params / 1e9:.2f}B parameters, {args.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

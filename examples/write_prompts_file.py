"""Write a prompts file (JSONL) from the open-QA data: the input of a study on "your own prompts".

    python examples/write_prompts_file.py --openqa-dir /work/shared/data/open-qa --out prompts.jsonl
    python -m tuner.search --task prompts.jsonl --openqa-dir /work/shared/data/open-qa

Each row is one long-context question built as the ``openqa`` task builds it (HotpotQA and SQuAD,
gold passages and distractors up to ``--max-prompt-tokens`` in the model's tokens, never cut): an
``id``, the ``prompt`` text, ``max_new_tokens`` and ``stop`` (the answers are one line). Like logged
traffic, the rows carry no answers unless ``--with-answers`` keeps the gold ones; a study on a file
without answers budgets in agreement points (docs/data.md). The rows are a hashed sample of all
questions, half from each dataset, so the study's own validation/test split of the file is ~30/70.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from transformers import AutoTokenizer

from lazyllm.models import DEFAULT_MODEL, resolve
from tuner.data.longbench import OPENQA_DATASETS, build_prompt
from tuner.data.openqa import PROMPTS, RecordBuilder, resolve_openqa_source


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--openqa-dir", help="folder of the open-QA JSON files (default: $OPENQA_DIR, else the hub)"
    )
    p.add_argument("--out", default="prompts.jsonl", help="the JSONL file to write (default: prompts.jsonl)")
    p.add_argument("--n", type=int, default=200, help="rows, half from each dataset (default: 200)")
    p.add_argument(
        "--max-prompt-tokens", type=int, default=1024, help="prompt length in tokens (default: 1024)"
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"whose tokens count (default: {DEFAULT_MODEL})")
    p.add_argument("--with-answers", action="store_true", help="keep the gold answers (default: no labels)")
    args = p.parse_args()
    if args.n < 2:
        p.error("--n must be at least 2")
    source, local = resolve(args.model)
    tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local)
    chat = bool(getattr(tokenizer, "chat_template", None))
    data = resolve_openqa_source(args.openqa_dir)
    rows = []
    for k, dataset in enumerate(OPENQA_DATASETS):
        want = args.n // 2 + (args.n % 2 if k == 0 else 0)
        builder = RecordBuilder(
            data.load(dataset), tokenizer, chat=chat, max_prompt_tokens=args.max_prompt_tokens
        )
        order = sorted(builder.corpus.questions, key=lambda q: hashlib.sha256(q.id.encode()).digest())
        taken = 0
        for question in order:  # a hashed sample of every question, whichever split it falls in
            if taken == want:
                break
            record = builder.build(question)
            if record is None:  # its gold passages alone do not fit the budget
                continue
            row = {
                "id": record.id,
                "prompt": build_prompt(record, PROMPTS),
                "max_new_tokens": PROMPTS.max_new_tokens[dataset],
                "stop": ["\n"],
            }
            if args.with_answers:
                row["answers"] = list(record.answers)
            rows.append(row)
            taken += 1
    out = Path(args.out)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    labels = "with gold answers" if args.with_answers else "no answers (agreement budget)"
    print(f"wrote {len(rows)} prompts of <= {args.max_prompt_tokens} tokens to {out}, {labels}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

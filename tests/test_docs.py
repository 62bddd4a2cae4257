"""The README and docs/*.md hold true: every relative link and anchor resolves, and every
``python -m MODULE ...`` command of a fenced bash block in the README parses against that CLI's own
argparse parser (nothing runs). Generic on purpose: the README may change, the checks stay."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
OPERATORS = {"&&", "||", ";", "|", "&"}


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced else re.sub(r"`[^`]*`", "``", line))
    return lines


def slugify(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, links reduced to their text, every
    character but letters, digits, ``-``, ``_`` and spaces dropped, spaces made ``-``.

    >>> slugify("How the level was chosen: `benchmarks/decision_rule.py`")
    'how-the-level-was-chosen-benchmarksdecision_rulepy'
    """
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()  # inline HTML
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor GitHub makes for ``page``'s headings (a repeated one gets ``-1``, ``-2``, ...)."""
    seen: Counter[str] = Counter()
    found = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced or not (m := HEADING.match(line)):
            continue
        slug = slugify(m.group(2))
        found.add(slug if seen[slug] == 0 else f"{slug}-{seen[slug]}")
        seen[slug] += 1
    found |= set(re.findall(r'<a\s+(?:name|id)="([^"]+)"', page.read_text()))
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link and image outside code."""
    return [
        (n, m.group(1)) for n, line in enumerate(_prose(page.read_text()), 1) for m in LINK.finditer(line)
    ]


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def broken_links(page: Path) -> list[str]:
    problems = []
    for line, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...
            continue
        path_part, _, anchor = target.partition("#")
        where = (page.parent / path_part).resolve() if path_part else page
        if not where.exists():
            problems.append(f"{_name(page)}:{line}: {target}: no such file")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            problems.append(f"{_name(page)}:{line}: {target}: no heading makes #{anchor}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken_links(page) == []


def test_the_link_checker_sees_a_broken_link_and_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A heading: `with code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-heading-with-code) [ok](other.md#twice-1) [ok](#mine) [web](https://x.org/#y)\n"
        "# Mine\n[bad](other.md#where-it-fails) [gone](missing.md) `[code](missing.md)`\n"
        "```bash\n[not a link](missing.md)\n```\n"
    )
    problems = [p.split(": ", 1)[1] for p in broken_links(page)]
    assert problems == [
        "other.md#where-it-fails: no heading makes #where-it-fails",
        "missing.md: no such file",
    ]


def bash_commands(text: str) -> list[str]:
    """Every command line of the fenced ```bash blocks (continuation lines joined)."""
    commands, block, lines = [], False, text.splitlines()
    pending = ""
    for line in lines:
        if not block:
            block = line.strip() in ("```bash", "```sh", "```shell")
            continue
        if line.strip().startswith("```"):
            block = False
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        if pending.strip():
            commands.append(pending.strip())
        pending = ""
    return commands


def module_calls(command: str) -> list[tuple[str, list[str]]]:
    """``(MODULE, argv)`` of every ``python -m MODULE argv...`` in a shell command line."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    calls = []
    for i, token in enumerate(tokens[:-2]):
        if re.search(r"(^|/)python3?(\.\d+)?$", token) and tokens[i + 1] == "-m":
            argv = []
            for arg in tokens[i + 3 :]:
                if arg in OPERATORS:
                    break
                argv.append(arg)
            calls.append((tokens[i + 2], argv))
    return calls


def cli_parser(module: str) -> argparse.ArgumentParser:
    """The CLI's own parser: its module's ``build_parser()`` or ``_parser()``."""
    mod = importlib.import_module(module)
    for name in ("build_parser", "_parser"):
        if callable(builder := getattr(mod, name, None)):
            parser = builder()
            assert isinstance(parser, argparse.ArgumentParser), f"{module}.{name}() is no ArgumentParser"
            return parser
    raise AssertionError(
        f"python -m {module}: the module has no build_parser() or _parser() to check against"
    )


def parse_error(module: str, argv: list[str]) -> str | None:
    """None if ``argv`` parses; else argparse's message."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            cli_parser(module).parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else str(exc)
    return None


def ours(module: str) -> bool:
    """Whether ``module`` is one of this repository's (``python -m venv`` is not checked)."""
    return (ROOT / module.split(".")[0]).is_dir()


README_CALLS = [
    call
    for command in bash_commands((ROOT / "README.md").read_text())
    for call in module_calls(command)
    if ours(call[0])
]


def test_the_readme_has_commands_to_check() -> None:
    assert README_CALLS, "no python -m command in a fenced bash block of the README"


@pytest.mark.parametrize(
    ("module", "argv"), README_CALLS, ids=[f"{m} {' '.join(a)}"[:80] for m, a in README_CALLS]
)
def test_every_readme_command_parses_against_its_cli(module: str, argv: list[str]) -> None:
    assert parse_error(module, argv) is None, (
        f"python -m {module} {shlex.join(argv)}: {parse_error(module, argv)}"
    )


def test_the_command_checker_finds_calls_and_refuses_bad_flags() -> None:
    text = (
        "```bash\nmake setup && .venv/bin/python -m tuner.search --task qa \\\n  --n-trials 3   # a comment\n"
        "PATH=x nice -n 10 python -m lazyllm.generate --prompt hi | tee out.txt\n```\n"
        "```python\npython -m not.a.shell.block\n```\n"
    )
    calls = [c for cmd in bash_commands(text) for c in module_calls(cmd)]
    assert calls == [
        ("tuner.search", ["--task", "qa", "--n-trials", "3"]),
        ("lazyllm.generate", ["--prompt", "hi"]),
    ]
    assert ours("tuner.search") and not ours("venv")
    assert parse_error("tuner.search", ["--task", "qa", "--n-trials", "3"]) is None
    assert "unrecognized arguments: --timeoutt 5" in str(parse_error("tuner.search", ["--timeoutt", "5"]))
    assert "one of the arguments --prompt-file --prompt is required" in str(
        parse_error("lazyllm.generate", [])
    )

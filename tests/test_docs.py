"""The README and docs/*.md hold true: every relative link and anchor resolves, and every
``python -m MODULE ...`` command of a fenced bash block in the README parses against that CLI's own
argparse parser (nothing runs). Generic on purpose: the README may change, the checks stay."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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


# --------------------------------------------------------------------------------------------------
# numbers: every README measurement traced to its file, every quoted default the code's
RESULTS = ROOT / "docs" / "results.md"
TRACE_HEADING = "## Where each README number comes from"
DECIMAL = re.compile(r"(?:(?<![\d.])-)?\d+\.\d+")  # a minus sign, not a range's dash


def _table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells, ``\\|`` unescaped) of the first table after ``heading``."""
    lines = text[text.index(heading) :].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
        rows.append([c.strip().replace("\\|", "|") for c in cells])
    return rows


def traced() -> list[tuple[str, str, str]]:
    """docs/results.md's (claim, file under benchmarks/data/, value) rows."""
    return [(claim, file, value) for claim, file, value in _table_after(RESULTS.read_text(), TRACE_HEADING)]


@pytest.mark.parametrize(("claim", "file", "value"), traced(), ids=[row[0][:60] for row in traced()])
def test_every_traced_number_is_in_its_file(claim: str, file: str, value: str) -> None:
    path = ROOT / "benchmarks" / "data" / file
    assert path.is_file(), f"{claim}: {path} does not exist"
    text = path.read_text(encoding="utf-8")
    for part in value.split(" ... "):
        assert part in text, f"{claim}: {part!r} is not in {file}"


def _readme_measurements() -> list[str]:
    """The decimals of the README's opening paragraph and of its results table."""
    readme = (ROOT / "README.md").read_text()
    opening = readme.split("\n\n")[1]
    table = [cell for row in _table_after(readme, "## Results") for cell in row]
    return DECIMAL.findall(opening) + [d for cell in table for d in DECIMAL.findall(cell)]


def test_every_readme_measurement_is_traced() -> None:
    values = " ".join(f"{claim} {value}" for claim, _, value in traced())
    numbers = _readme_measurements()
    assert len(numbers) > 20
    missing = sorted({n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", values)})
    assert not missing, (
        f"README numbers with no file in docs/results.md#{slugify(TRACE_HEADING[3:])}: {missing}"
    )


def test_no_doc_names_commands_by_number() -> None:
    """The README no longer numbers its commands; the docs name them ("the CPU quickstart")."""
    assert not [p.name for p in PAGES if "README command" in p.read_text()]


def _literal(text: str) -> str | None:
    """The leading literal of a default as the docs write it (`` `tpe` ``, ``2.0 score points``,
    ``420 s``), or None where it is prose (``every validation example``)."""
    found = re.match(r"`?([-\w.]+)`?(?:\s|$|\s*\()", text.strip() + " ")
    if found is None or not re.fullmatch(r"-?[\d.]+|[a-z][\w.-]*", found[1]):
        return None
    word = found[1]
    return None if word in {"every", "from", "the", "a", "an", "any"} else word


def _same(literal: str, default: object) -> bool:
    if default is None:
        return literal == "none"
    if isinstance(default, bool):
        return literal == str(default).lower()
    if isinstance(default, (int, float)):
        try:
            return float(literal) == float(default)
        except ValueError:
            return False
    return literal == str(default)


def quoted_defaults() -> list[tuple[str, str, str]]:
    """(page, flag, the default it quotes): the settings table of docs/tuning.md (``| `--a` / `--b` |
    x / y |``) and every "`--flag` (default X)" of the docs."""
    from tuner.study.settings import SearchSettings

    flags = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(SearchSettings)}
    found: list[tuple[str, str, str]] = []
    tuning = (ROOT / "docs" / "tuning.md").read_text()
    for row in _table_after(tuning, "and `--help` lists each with its default."):
        names = re.findall(r"`(--[a-z-]+)`", row[0])
        parts = [p for p in row[1].split(" / ")] if len(names) > 1 else [row[1]]
        for name, part in zip(names, parts):
            literal = _literal(part)
            if name in flags and literal is not None:
                found.append(("tuning.md", name, literal))
    for page in PAGES:
        for name, value in re.findall(
            r"`(--[a-z-]+)`[^`|.;]{0,60}\(default:? `?([-\w.]+)`?", page.read_text()
        ):
            if name in flags:
                found.append((page.name, name, value))
    return found


@pytest.mark.parametrize(("page", "flag", "quoted"), quoted_defaults(), ids=lambda x: str(x))
def test_every_quoted_default_is_the_codes(page: str, flag: str, quoted: str) -> None:
    from tuner.study.settings import SearchSettings

    default = getattr(SearchSettings(), flag[2:].replace("-", "_"))
    assert _same(quoted, default), f"{page} quotes {flag} default {quoted!r}; the code's is {default!r}"


def test_the_search_cap_quoted_is_the_one_a_default_study_runs() -> None:
    """docs/tuning.md's ``--max-kl`` row quotes the cap SmolLM2's default study searches under."""
    from tuner.study.settings import SearchSettings

    row = next(
        r
        for r in _table_after(
            (ROOT / "docs" / "tuning.md").read_text(), "and `--help` lists each with its default."
        )
        if "`--max-kl`" in r[0]
    )
    quoted = re.search(r"\((\d\.\d+) nats for SmolLM2 at 1024 tokens and 2 points", row[1])
    assert quoted, row[1]
    assert float(quoted[1]) == round(float(SearchSettings().search_cap or 0), len(quoted[1]) - 2)

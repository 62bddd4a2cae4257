"""Tune LazyLLM pruning schedules with an Optuna multi-objective study.

    python -m tuner.search --task qa --data-dir ../shared/data/longbench

Maximises the TTFT speedup and minimises the accuracy loss of per-layer schedules on the task's
LongBench validation examples, then writes the Pareto front as JSON schedules, ``recommended.json``
(the fastest within ``--max-accuracy-loss``) and plots to ``--output/<study-name>/``, and checks the
recommendation on the test split against the best of a few hand-made paper-style schedules.
Settings: dataclass defaults -> ``--preset`` YAML (``studies/*.yaml``) -> flags. Rerunning the same
command resumes the study (it stops once the study holds ``--n-trials`` finished trials).

This module only parses and dispatches: the run is :func:`tuner.orchestration.session.run_study`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from tuner.interrupts import interrupts_end_the_start

with interrupts_end_the_start(__name__):  # Ctrl-C while torch loads: one line
    from lazyllm.cli import USER_ERRORS, cli_main, one_line
    from tuner.redact import redact_text
    from tuner.study.settings import EvalSettings, SearchSettings, add_flags, settings_from_flags

RESUME_HINT = "interrupted: finished trials are saved; rerun the same command to resume"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tuner.search",
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Flags override the preset, which overrides the defaults shown.",
    )
    p.add_argument("--preset", help="YAML preset: a name under studies/ (e.g. qa) or a path")
    evaluation = {f for f in EvalSettings.__dataclass_fields__ if f != "split"}
    add_flags(p.add_argument_group("what to evaluate on"), SearchSettings, only=evaluation)
    add_flags(p.add_argument_group("study"), SearchSettings, exclude=evaluation | {"split"})
    return p


def settings_from_args(args: argparse.Namespace) -> SearchSettings:
    return settings_from_flags(args, SearchSettings)


def parse_settings(argv: Sequence[str] | None) -> SearchSettings:
    """The settings the command line ``argv`` asks for (defaults -> preset -> flags)."""
    return settings_from_args(_parser().parse_args(argv))


class _NoInterruptTracebacks(logging.Filter):
    """Drops log records that carry a ``KeyboardInterrupt`` (a library logging Ctrl-C on its way
    out, e.g. SQLAlchemy's "Exception during reset"): Ctrl-C is the one line the CLI prints."""

    def filter(self, record: logging.LogRecord) -> bool:
        kind = record.exc_info[0] if record.exc_info else None
        return not (kind is not None and issubclass(kind, KeyboardInterrupt))


_QUIET = _NoInterruptTracebacks()


def _quiet_interrupts() -> None:
    root = logging.getLogger()
    if not root.handlers:  # what logging.lastResort does for libraries that log, plus the filter
        fallback = logging.StreamHandler()
        fallback.setLevel(logging.WARNING)
        root.addHandler(fallback)
    for name in ("", "optuna", "mlflow"):
        for handler in logging.getLogger(name).handlers:
            handler.addFilter(_QUIET)  # one instance: adding it again is a no-op


def main(argv: Sequence[str] | None = None) -> int:
    def run(args: argparse.Namespace) -> int:
        from tuner.orchestration.session import run_study  # heavy imports only once the flags parse
        from tuner.tracking.runs import end_open_runs

        settings = settings_from_args(args)
        if not (args.debug or os.environ.get("LAZYLLM_DEBUG") == "1"):
            _quiet_interrupts()
        try:
            return run_study(settings)
        except KeyboardInterrupt:
            end_open_runs("KILLED", "interrupted (Ctrl-C)")  # the parent run says so; a rerun reopens it
            raise
        except USER_ERRORS as exc:
            end_open_runs("FAILED", f"error: {one_line(exc)}")
            raise

    return cli_main(_parser(), run, argv, interrupted=RESUME_HINT, redact=redact_text)


if __name__ == "__main__":
    sys.exit(main())

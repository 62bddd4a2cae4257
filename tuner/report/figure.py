"""Matplotlib for every figure the tuner draws: the headless backend chosen in one place, each figure
saved as a PNG (beside its target, then moved into place) and closed."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from lazyllm.atomic import replace_with
from tuner.interrupts import held_interrupts

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def pyplot():  # type: ignore[no-untyped-def]
    """``matplotlib.pyplot`` on the Agg backend (no display needed; imported only when drawing). The
    first import holds a Ctrl-C until it is done: one arriving inside a compiled module's
    initialisation surfaces as ``ImportError: initialization failed``, not as the interrupt it was."""
    with held_interrupts():
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Figure, path: Path) -> None:
    """``fig`` as a PNG at ``path``, then closed."""
    fig.savefig(path, dpi=120, format="png")
    pyplot().close(fig)


def write_figure(fig: Figure, path: Path) -> Path:
    """``fig`` as a PNG at ``path``, never half-written (:func:`lazyllm.atomic.replace_with`), then closed."""
    return replace_with(path, lambda tmp: save_figure(fig, tmp), suffix=".png")

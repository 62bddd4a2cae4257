from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import importlib.abc, signal, sys

    class Interrupt(importlib.abc.MetaPathFinder):
        # a Ctrl-C that arrives while matplotlib's compiled image module is being imported
        def find_spec(self, name, path=None, target=None):
            if name == "matplotlib._image":
                sys.meta_path.remove(self)
                signal.raise_signal(signal.SIGINT)
            return None

    sys.meta_path.insert(0, Interrupt())
    from tuner.report.figure import pyplot
    try:
        pyplot()
    except KeyboardInterrupt:
        print("interrupted;", "pyplot imported" if "matplotlib.pyplot" in sys.modules else "pyplot missing")
    """
)


def test_a_ctrl_c_inside_the_matplotlib_import_is_raised_once_the_import_is_whole() -> None:
    """A real SIGINT mid-import (fresh interpreter): the interrupt still arrives, as KeyboardInterrupt,
    and only after ``matplotlib.pyplot`` is whole, so no half-initialised module is left behind."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.stdout.strip() == "interrupted; pyplot imported", out.stderr[-2000:]

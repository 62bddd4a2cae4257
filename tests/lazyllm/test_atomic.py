"""lazyllm.atomic: saves that several processes make at once never tear or fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lazyllm.atomic import replace_with, unique_temporary, write_atomic
from lazyllm.schedule import Schedule

_SAVER = """
import sys, time
from lazyllm.schedule import Schedule
schedule = Schedule("m", tuple(float(sys.argv[2]) for _ in range(2000)) + (0.0,))
schedule.save(sys.argv[1])
while time.time() < float(sys.argv[3]):  # every writer busy until one shared deadline
    schedule.save(sys.argv[1])
"""


def test_processes_saving_one_schedule_at_once_leave_one_whole_file(tmp_path: Path) -> None:
    """Defect: ``Schedule.save`` wrote ``<name>.tmp`` for everyone; a second writer's rename found it
    gone (FileNotFoundError), or moved the first one's half-written bytes into place."""
    target = tmp_path / "s.json"
    root = Path(__file__).resolve().parents[2]
    deadline = str(time.time() + 8)  # past every writer's start-up, so they overlap
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(target), value, deadline],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            stderr=subprocess.PIPE,
            text=True,
        )
        for value in ("10.0", "20.0", "30.0")
    ]
    errors = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    saved = Schedule.load(target)  # whole: one writer's complete file
    assert len(set(saved.percentiles[:-1])) == 1 and saved.percentiles[0] in (10.0, 20.0, 30.0)
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # no temporary left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = write_atomic(tmp_path / "f.txt", "old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("ne")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        replace_with(target, half_then_fail)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


_KILLED_MID_WRITE = """
import sys, time
from pathlib import Path
from lazyllm.atomic import replace_with

def fill(tmp):
    tmp.write_text('{"half": ')  # half written, then killed before the rename
    print("writing", flush=True)
    time.sleep(60)

replace_with(Path(sys.argv[1]), fill)
"""


def killed_mid_write(target: Path) -> Path:
    """Run a real writer of ``target``, SIGKILL it mid-write; return the temporary it left."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_MID_WRITE, str(target)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    proc.kill()
    proc.wait(timeout=30)
    (left,) = [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.")]
    return left


def test_a_writer_killed_mid_write_leaves_a_temporary_the_next_run_removes(tmp_path: Path) -> None:
    """Issue 32 item 6: a SIGKILL during the final writes left ``.heldout.json.<random>.tmp`` for good."""
    from lazyllm.atomic import LEGACY_AGE_S, remove_dead_temporaries

    target = tmp_path / "heldout.json"
    left = killed_mid_write(target)
    assert not target.exists()
    live = unique_temporary(tmp_path / "other.json")  # this process is alive: its temporary is kept
    old_style = tmp_path / "pareto" / ".trial-1.json.abcd_123.tmp"  # an older version's name
    old_style.parent.mkdir()
    old_style.write_text("{")
    os.utime(old_style, (time.time() - LEGACY_AGE_S - 1,) * 2)
    young = tmp_path / ".pareto.csv.wxyz_123.tmp"  # maybe still being written by an older version
    young.write_text("x")
    keep = tmp_path / ".lock"
    keep.write_text("")
    assert sorted(remove_dead_temporaries(tmp_path)) == sorted([left, old_style])
    assert live.exists() and young.exists() and keep.exists()
    # the next write of the same target removes its dead writers' temporaries too
    again = killed_mid_write(target)
    write_atomic(target, "{}")
    assert not again.exists() and target.read_text() == "{}"

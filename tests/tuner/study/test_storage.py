"""tuner.study.storage: the study's identity guards it, warm starts are queued once, storage errors are one masked line."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tuner.study.settings import SearchSettings
from tuner.study.spaces import load_space
from tuner.study.storage import make_storage, open_study, study_lock, warm_start


def _settings(tmp_path: Path, **changes: object) -> SearchSettings:
    return SearchSettings(output=str(tmp_path), study_name="s", **changes)  # type: ignore[arg-type]


def test_a_study_made_with_other_settings_is_refused(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}")
    try:
        study = open_study(settings, 30, storage)
        assert (
            study.user_attrs["identity"] == settings.study_identity() and study.user_attrs["num_layers"] == 30
        )
        assert study.metric_names == ["speedup", "accuracy_loss"]
        assert open_study(settings, 30, storage).study_name == "s"  # the same settings resume it
        with pytest.raises(
            ValueError,
            match=r"made with other settings \{'max_accuracy_loss': \(2.0, 1.0\), 'search_cap': \(",
        ):  # the prior-derived cap follows the budget
            open_study(_settings(tmp_path, max_accuracy_loss=1.0), 30, storage)
    finally:
        storage.engine.dispose()


def test_a_study_stored_before_a_setting_existed_resumes_with_its_old_meaning(tmp_path: Path) -> None:
    """A study stored before ``dtype`` was a setting ran with the device's default: it resumes with
    ``auto`` and refuses ``bfloat16``."""
    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}")
    try:
        study = open_study(_settings(tmp_path), 30, storage)
        old = {k: v for k, v in study.user_attrs["identity"].items() if k != "dtype"}
        study.set_user_attr("identity", old)
        assert open_study(_settings(tmp_path), 30, storage).study_name == "s"
        with pytest.raises(ValueError, match=r"other settings \{'dtype': \('auto', 'bfloat16'\)\}"):
            open_study(_settings(tmp_path, dtype="bfloat16"), 30, storage)
    finally:
        storage.engine.dispose()


def test_warm_starts_are_queued_once(tmp_path: Path) -> None:
    storage = make_storage(f"sqlite:///{tmp_path / 'study.db'}")
    try:
        study = open_study(_settings(tmp_path), 30, storage)
        space = load_space("stages")
        warm_start(study, space, 30)
        warm_start(study, space, 30)  # a resume: nothing queued again
        trials = study.get_trials()
        assert trials[0].user_attrs == {"keep_all": True}  # the reference trial, no parameters
        assert [t.system_attrs["fixed_params"] for t in trials[1:]] == space.warm_start(30)
    finally:
        storage.engine.dispose()


def test_storage_errors_are_one_line_with_the_password_masked(tmp_path: Path) -> None:
    with pytest.raises(ValueError) as info:
        make_storage("postgresql+psycopg://bob:s3cret@127.0.0.1:1/db")
    text = str(info.value)
    assert "s3cret" not in text and "bob:***@" in text and "\n" not in text


def _refused(lock: Path) -> bool:
    """Whether another holder has ``lock`` now: a non-blocking ``flock`` from a fresh open (a lock of its
    own even in this process) is refused, never waited for."""
    with lock.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def test_study_lock_makes_the_folder_and_is_reentrant_across_uses(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    with study_lock(folder):
        assert (folder / ".lock").exists()
        assert _refused(folder / ".lock")  # held: another taker is refused
    assert not _refused(folder / ".lock")  # released on exit (probed without blocking: never a hang)
    with study_lock(folder):  # so a second use does not block
        assert _refused(folder / ".lock")
    assert not _refused(folder / ".lock")


_HOLDER = """
import sys
from pathlib import Path
from tuner.study.storage import study_lock
with study_lock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()  # hold until the test lets go
print("released", flush=True)
sys.stdin.readline()  # alive after the release: a lock leaked past the block would still be held
"""


def _holder(folder: Path) -> subprocess.Popen[bytes]:
    root = Path(__file__).resolve().parents[3]
    return subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(folder)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        bufsize=0,  # unbuffered: select() sees every line the holder printed
    )


def _line(proc: subprocess.Popen[bytes], timeout: float) -> bytes | None:
    """``proc``'s next line (b"" once it exited), or None if none came within ``timeout`` seconds."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else None


def _let_go(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"\n")


def _waiting(lock: Path) -> set[int]:
    """The processes the kernel lists as blocked in ``flock`` on ``lock`` (the ``->`` lines of
    ``/proc/locks``: ``1: -> FLOCK ADVISORY WRITE <pid> <major>:<minor>:<inode> 0 EOF``)."""
    inode, pids = lock.stat().st_ino, set()
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields:
            at = fields.index("->")
            if fields[at + 1] == "FLOCK" and int(fields[at + 5].rsplit(":", 1)[1]) == inode:
                pids.add(int(fields[at + 4]))
    return pids


def test_study_lock_makes_a_second_process_wait_until_the_first_lets_go(tmp_path: Path) -> None:
    """Two workers on one machine: the second blocks in ``flock`` (the kernel lists it as waiting) and
    gets the lock only once the first leaves its block, while the first is still alive. Every wait is
    bounded (``bound_s`` covers a Python start-up and the imports on a busy machine; it is not what is
    tested): a lock never passed on fails the test, it does not hang it."""
    bound_s = 60.0
    folder = tmp_path / "a" / "b"
    first = _holder(folder)
    second: subprocess.Popen[bytes] | None = None
    try:
        assert _line(first, bound_s) == b"held\n"
        second = _holder(folder)
        deadline = time.monotonic() + bound_s
        while second.pid not in _waiting(folder / ".lock"):
            line = _line(second, 0.05)
            assert line is None, f"the second process did not wait for the lock the first held: {line!r}"
            assert time.monotonic() < deadline, "the second process never waited for the lock"
        assert _line(second, 0.5) is None  # still waiting: the first has not let go
        _let_go(first)
        assert _line(first, bound_s) == b"released\n"
        assert _line(second, bound_s) == b"held\n", "the first let go, but the second never got the lock"
        assert first.poll() is None  # passed on by the release itself, not by the first one's exit
        for proc in (second, first, second):
            _let_go(proc)
        assert [first.wait(bound_s), second.wait(bound_s)] == [0, 0]
    finally:
        for left in (first, second):
            if left is not None and left.poll() is None:
                left.kill()
                left.wait()

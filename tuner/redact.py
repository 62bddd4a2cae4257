"""Secrets never leave the process: passwords inside URLs are masked before anything is printed,
logged, written to MLflow or stored as a study attribute.

>>> redact("cannot open postgresql+psycopg://bob:s3cr%40t@db:5432/optuna: timeout")
'cannot open postgresql+psycopg://bob:***@db:5432/optuna: timeout'
>>> redact("sqlite:///runs/s/study.db")
'sqlite:///runs/s/study.db'
"""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:/?#@\s]*):(?P<password>[^@\s/]*)@")
MASK = "***"


def redact(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` URL in it masked."""
    return _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{MASK}@", text)


def redact_url(url: str | None) -> str | None:
    """One URL with its password masked (None stays None)."""
    return None if url is None else redact(url)

"""Mask passwords in URLs before they reach a log line, an MLflow param or tag, or a study attribute.

    >>> redact_url("postgresql+psycopg://lazyllm:s3cret@db-host:5432/lazyllm")
    'postgresql+psycopg://lazyllm:***@db-host:5432/lazyllm'
    >>> redact_url("sqlite:////tmp/study.db")
    'sqlite:////tmp/study.db'

Only the password of a ``user:password@`` authority is replaced; the scheme, user, host, port, path
and query stay readable, so a redacted URL still says which store was used. A URL without a password
(or a plain path) is returned unchanged. ``redact_text`` masks every such URL inside a longer string
(an exception message, a log line).
"""

from __future__ import annotations

import re

MASK = "***"

# scheme://user:password@  (the password may hold anything but '@', '/' and whitespace; the user no ':')
_AUTHORITY = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*:)(?P<password>[^@/\s]*)@")


def redact_url(url: str) -> str:
    """``url`` with the password of its ``user:password@`` part replaced by ``***``."""
    return _AUTHORITY.sub(lambda m: f"{m['head']}{MASK}@", url, count=1)


def redact_text(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``."""
    return _AUTHORITY.sub(lambda m: f"{m['head']}{MASK}@", text)

"""The one secret masker: passwords in URLs, before a line reaches a terminal, a log, MLflow or Optuna.

    >>> redact_text("postgresql+psycopg://lazyllm:s3cret@db-host:5432/lazyllm")
    'postgresql+psycopg://lazyllm:***@db-host:5432/lazyllm'
    >>> redact_text("cannot reach postgresql://u:s3/cr@t@h/db?sslmode=require&Password=x%26y refused")
    'cannot reach postgresql://u:***@h/db?sslmode=require&Password=*** refused'
    >>> redact_text("sqlite:////tmp/study.db")
    'sqlite:////tmp/study.db'

Built on the URL grammar (RFC 3986), read the way database drivers and HTTP clients read what users
really type, not one regular expression of one form:

* **userinfo**: in ``scheme://user:password@host``, everything from the first ``:`` after the user to
  the *last* ``@`` on that line before the next ``scheme://`` is the password. RFC 3986 wants ``/``,
  ``@``, ``:``, ``?`` and ``#`` percent-encoded there, but SQLAlchemy and ``requests`` accept them raw
  (they split at the last ``@``), so the masker does too: a raw ``/`` or ``@`` in a password is masked
  whole, and so is a raw space. Erring long is deliberate: an odd ``@`` later on the line masks a
  little too much, never too little.
* **query parameters** named ``password``, ``passwd``, ``pwd``, ``token`` or ``secret`` (any case,
  the name percent-decoded first): the value up to the next ``&`` or whitespace.

Both rules mark character spans of the original text; overlapping spans are merged and each is
replaced by ``***`` once, so one rule can never leave part of a secret the other one cut into.
Scheme, user, host, port, path and the other query parameters stay readable, so a masked URL still
says which store was used. ``redact_url`` is the same function, for a single URL.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
SECRET_PARAMETERS = frozenset({"password", "passwd", "pwd", "token", "secret"})

# scheme ":" "//" then a user (no ':', '/', '@' or whitespace; may be empty) then ':' (RFC 3986 3.1, 3.2.1)
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
# a query parameter: after '?', '&' or ';', a name, '=', a value up to '&' or whitespace (RFC 3986 3.4)
_PARAMETER = re.compile(r"(?<=[?&;])(?P<name>[^=&;?#\s]+)=(?P<value>[^&\s]*)")


def _userinfo_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of every userinfo password: from after ``user:`` to the last ``@`` on its line
    before the next ``scheme://``."""
    spans = []
    for match in _USERINFO.finditer(text):
        start = match.end()
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        following = _SCHEME.search(text, start, line_end)
        stop = following.start() if following else line_end
        at = text.rfind("@", start, stop)
        if at >= 0:
            spans.append((start, at))
    return spans


def _parameter_spans(text: str) -> list[tuple[int, int]]:
    return [
        m.span("value")
        for m in _PARAMETER.finditer(text)
        if unquote(m["name"]).strip().lower() in SECRET_PARAMETERS
    ]


def redact_text(text: str) -> str:
    """``text`` with every password of every URL in it replaced by ``***`` (see the module docstring)."""
    spans = sorted(_userinfo_spans(text) + _parameter_spans(text))
    if not spans:
        return text
    merged: list[list[int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    out, last = [], 0
    for start, end in merged:
        out += [text[last:start], MASK]
        last = end
    out.append(text[last:])
    return "".join(out)


redact_url = redact_text
"""A single URL with its passwords masked (the same rules as :func:`redact_text`)."""

"""The one secret masker: credentials in URLs, before a line reaches a terminal, a log, MLflow, Optuna or a file.

    >>> redact_text("postgresql+psycopg://lazyllm:s3cret@db-host:5432/lazyllm")
    'postgresql+psycopg://lazyllm:***@db-host:5432/lazyllm'
    >>> redact_text("cannot reach postgresql://u:s3/cr@t@h/db?sslmode=require&Password=x%26y refused")
    'cannot reach postgresql://u:***@h/db?sslmode=require&Password=*** refused'
    >>> redact_text("sqlite:////tmp/study.db")
    'sqlite:////tmp/study.db'
    >>> redact_text("https://ghp_TOKEN:x-oauth-basic@h/x and http://TOKEN@127.0.0.1:1?api_key=k&a=1")
    'https://***@h/x and http://***@127.0.0.1:1?api_key=***&a=1'

Built on the URL grammar (RFC 3986), read the way database drivers and HTTP clients read what users
really type, not one regular expression of one form:

* **userinfo**: in ``scheme://user:password@host``, everything from the first ``:`` after the user to
  the *last* ``@`` on that line before the next ``scheme://`` is the password. RFC 3986 wants ``/``,
  ``@``, ``:``, ``?`` and ``#`` percent-encoded there, but SQLAlchemy and ``requests`` accept them raw
  (they split at the last ``@``), so the masker does too: a raw ``/`` or ``@`` in a password is masked
  whole, and so is a raw space. Erring long is deliberate: an odd ``@`` later on the line masks a
  little too much, never too little.
* **http(s) userinfo, password or not**: in ``http://TOKEN@host`` or ``https://TOKEN:x-oauth-basic@host``
  the user part is a credential too (tokens are passed that way), so for ``http`` and ``https`` the
  whole userinfo is masked: ``https://***@host``. A bare user ends at the last ``@`` before the
  first ``/``, ``?``, ``#`` or whitespace. Database URLs keep their user name readable
  (``postgresql://lazyllm:***@db``), since there the user is not a secret.
* **query parameters** named in :data:`SECRET_PARAMETERS` (``password``, ``sslpassword``,
  ``passwd``, ``pwd``, ``token``, ``access_token``, ``api_key``, ``apikey``, ``key``, ``secret``,
  ``sig``, ``signature``, ``credential``; any case, the name percent-decoded first and ``-`` read as
  ``_``): the value up to the next ``&`` or whitespace.

Both rules mark character spans of the original text; overlapping spans are merged and each is
replaced by ``***`` once, so one rule can never leave part of a secret the other one cut into.
Scheme, user, host, port, path and the other query parameters stay readable, so a masked URL still
says which store was used. ``redact_url`` is the same function, for a single URL.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
SECRET_PARAMETERS = frozenset(
    {
        "password",
        "sslpassword",
        "passwd",
        "pwd",
        "token",
        "access_token",
        "api_key",
        "apikey",
        "key",
        "secret",
        "sig",
        "signature",
        "credential",
    }
)
"""Query parameter names whose value is masked (compared lower-cased, percent-decoded, ``-`` as ``_``)."""

# scheme ":" "//" then a user (no ':', '/', '@' or whitespace; may be empty) then ':' (RFC 3986 3.1, 3.2.1)
_USERINFO = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
_HTTP = re.compile(r"(?<![A-Za-z0-9+.\-])https?://", re.IGNORECASE)
_AUTHORITY_END = re.compile(r"[/?#\s]")
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


def _http_user_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) of the whole userinfo of every http(s) URL: the user part is a credential there."""
    spans = []
    for match in _HTTP.finditer(text):
        start = match.end()
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        following = _SCHEME.search(text, start, line_end)
        stop = following.start() if following else line_end
        if _USERINFO.match(text, match.start()):  # user:password: up to the last '@', as above
            at = text.rfind("@", start, stop)
        else:  # a bare user: up to the last '@' of the authority
            end = _AUTHORITY_END.search(text, start, stop)
            at = text.rfind("@", start, end.start() if end else stop)
        if at > start:
            spans.append((start, at))
    return spans


def _parameter_spans(text: str) -> list[tuple[int, int]]:
    return [
        m.span("value")
        for m in _PARAMETER.finditer(text)
        if unquote(m["name"]).strip().lower().replace("-", "_") in SECRET_PARAMETERS
    ]


def redact_text(text: str) -> str:
    """``text`` with every credential of every URL in it replaced by ``***`` (see the module docstring)."""
    spans = sorted(_userinfo_spans(text) + _http_user_spans(text) + _parameter_spans(text))
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
"""A single URL with its credentials masked (the same rules as :func:`redact_text`)."""

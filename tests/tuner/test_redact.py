"""Passwords in storage and tracking URLs are masked; everything else stays readable."""

from __future__ import annotations

import pytest

from tuner.redact import MASK, redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg://lazyllm:s3cr%40t@db-host:5432/lazyllm?sslmode=require",
         f"postgresql+psycopg://lazyllm:{MASK}@db-host:5432/lazyllm?sslmode=require"),
        ("http://alice:pa:ss@127.0.0.1:5000", f"http://{MASK}@127.0.0.1:5000"),  # http(s): user too
        ("https://bob:x@mlflow.example.org/path", f"https://{MASK}@mlflow.example.org/path"),
        ("postgresql://user:@host/db", f"postgresql://user:{MASK}@host/db"),  # empty password: still masked
        ("sqlite:////tmp/runs/study.db", "sqlite:////tmp/runs/study.db"),
        ("sqlite:///relative/mlflow.db", "sqlite:///relative/mlflow.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("postgresql://user@host/db", "postgresql://user@host/db"),  # no password: unchanged
        ("runs/study/study.db", "runs/study/study.db"),
    ],
)  # fmt: skip
def test_redact_url(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_text_masks_every_url() -> None:
    line = "cannot open postgresql+psycopg://u:one@h/db nor http://v:two@h:5000 (sqlite:////x.db is fine)"
    out = redact_text(line)
    assert "one" not in out and "two" not in out
    assert out.count(MASK) == 2 and "sqlite:////x.db" in out


# ---- issue 21: the URL grammar, not one form; a property test over arbitrary passwords --------------

import string  # noqa: E402
from urllib.parse import quote  # noqa: E402

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("postgresql://user:s3/cret@127.0.0.1:5432/db", "s3/cret", "@127.0.0.1:5432/db"),  # '/' raw
        ("http://u:p@ss_s3cret@h:5000", "ss_s3cret", "http://***@h:5000"),  # '@' raw: the last '@' ends it
        ("postgresql://h/db?sslmode=require&password=s3cret", "s3cret", "sslmode=require&password=***"),
        ("http://h/x?PassWD=s3cret&a=1", "s3cret", "PassWD=***&a=1"),  # any case
        ("http://h/x?pass%77ord=s3cret", "s3cret", "?pass%77ord=***"),  # a percent-encoded name
        ("http://h/x?token=s3cret#frag", "s3cret#frag", "?token=***"),
        ("mysql://u:a%40b%2Fc@h/db", "a%40b%2Fc", "mysql://u:***@h/db"),  # percent-encoded
        ("postgresql://u:pa ss word@h/db is down", "pa ss word", "***@h/db is down"),  # raw spaces
    ],
)  # fmt: skip
def test_url_forms_are_masked(text: str, secret: str, kept: str) -> None:
    out = redact_text(f"error: cannot reach {text} (x)")
    assert secret not in out and kept in out and MASK in out


_NAMES = [
    "password", "passwd", "pwd", "token", "secret", "PASSWORD", "Token", "pAsSwD", "sslpassword",
    "access_token", "api_key", "API-KEY", "apikey", "key", "sig", "Signature", "credential",
]  # fmt: skip
# any printable character but a line break (a secret spanning lines is not one URL)
_PRINTABLE = st.characters(blacklist_categories=("Cc", "Cs"), blacklist_characters="\n\r\x85\u2028\u2029")
_SAFE = string.ascii_letters + string.digits + "._-"


@st.composite
def _urls(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A URL with a secret in its userinfo and/or in a query parameter, raw or percent-encoded;
    returns the line it is printed in and the secrets as they appear in it."""
    scheme = draw(st.sampled_from(["postgresql", "postgresql+psycopg", "mysql", "http", "https", "redis"]))
    user = draw(st.text(_SAFE, min_size=0, max_size=8))
    host = draw(st.sampled_from(["127.0.0.1", "db-host", "[::1]", "mlflow.example.org"]))
    port = draw(st.sampled_from(["", ":5432", ":1"]))
    path = draw(st.sampled_from(["", "/", "/db", "/a/b"]))
    slots: dict[str, str] = {}  # placeholder (a control character, never generated) -> secret
    userinfo = ""
    if scheme.startswith("http") and draw(st.booleans()):  # a bare token as the user: a credential
        slots["\x02"] = draw(st.text(_SAFE, min_size=6, max_size=30))
        userinfo = "\x02@"
    elif draw(st.booleans()):
        raw = draw(st.text(_PRINTABLE, min_size=6, max_size=30))
        slots["\x00"] = quote(raw, safe="") if draw(st.booleans()) else raw
        userinfo = f"{user}:\x00@"
    query = [f"k{i}=v{i}" for i in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()) or not slots:
        raw = draw(st.text(_PRINTABLE, min_size=6, max_size=30))
        encoded = draw(st.booleans())
        # raw, a value ends at '&' or whitespace by the grammar; such a value must be encoded
        slots["\x01"] = quote(raw, safe="") if encoded or any(c == "&" or c.isspace() for c in raw) else raw
        query.insert(draw(st.integers(0, len(query))), f"{draw(st.sampled_from(_NAMES))}=\x01")
    url = f"{scheme}://{userinfo}{host}{port}{path}" + ("?" + "&".join(query) if query else "")
    line = draw(
        st.sampled_from(["{}", "error: cannot reach {}: refused", "'{}'", "uri={} and sqlite:////x.db"])
    )
    template = line.replace("{}", url)
    rest = template
    for slot in slots:
        rest = rest.replace(slot, MASK)
    # the secret must not occur in the rest of the line by chance ("000000" as the user name too)
    assume(all(secret not in rest for secret in slots.values()))
    text = template
    for slot, secret in slots.items():
        text = text.replace(slot, secret)
    return text, list(slots.values())


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(_urls())
def test_no_secret_survives_masking(case: tuple[str, list[str]]) -> None:
    text, secrets = case
    out = redact_text(text)
    for secret in secrets:
        assert secret not in out, (text, out)
    assert redact_text(out) == out  # masking is idempotent
    assert out.count(MASK) >= 1


# ---- issue 32: bare userinfo of http(s) URLs and the documented secret query parameters -------------


@pytest.mark.parametrize(
    ("text", "secret", "kept"),
    [
        ("http://TOKEN@127.0.0.1:1", "TOKEN", "http://***@127.0.0.1:1"),
        ("https://TOKEN:x-oauth-basic@h", "TOKEN", "https://***@h"),
        ("HTTPS://TOKEN@h/a?b=1", "TOKEN", "***@h/a?b=1"),
        ("sqlite:////tmp/x/study.db?sslpassword=SECRET", "SECRET", "study.db?sslpassword=***"),
        ("http://h/x?api_key=SECRET&a=1", "SECRET", "api_key=***&a=1"),
        ("http://h/x?access_token=SECRET", "SECRET", "access_token=***"),
        ("https://acct.blob.core.windows.net/c?sv=1&sig=SECRET", "SECRET", "sv=1&sig=***"),
        ("http://h/x?api-key=SECRET", "SECRET", "api-key=***"),
        ("http://h/x?apikey=SECRET&key=SECRET2", "SECRET", "apikey=***&key=***"),
        ("http://h/x?signature=SECRET&credential=C2", "SECRET", "signature=***&credential=***"),
    ],
)  # fmt: skip
def test_credential_forms_are_masked(text: str, secret: str, kept: str) -> None:
    out = redact_url(text)
    assert secret not in out and kept in out, out


@pytest.mark.parametrize(
    "text",
    ["postgresql://user@host/db", "http://127.0.0.1:5000/x?keep=1&monkey=2", "http://h/a?sslmode=require"],
)
def test_non_credentials_stay_readable(text: str) -> None:
    assert redact_url(text) == text

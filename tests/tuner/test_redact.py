"""Passwords in storage and tracking URLs are masked; everything else stays readable."""

from __future__ import annotations

import pytest

from tuner.redact import MASK, redact_text, redact_url


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql+psycopg://lazyllm:s3cr%40t@db-host:5432/lazyllm?sslmode=require",
         f"postgresql+psycopg://lazyllm:{MASK}@db-host:5432/lazyllm?sslmode=require"),
        ("http://alice:pa:ss@127.0.0.1:5000", f"http://alice:{MASK}@127.0.0.1:5000"),
        ("https://bob:x@mlflow.example.org/path", f"https://bob:{MASK}@mlflow.example.org/path"),
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

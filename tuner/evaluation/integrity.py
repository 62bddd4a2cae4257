"""Proof that a cache file is what the code would compute, and the one line said when it is not.

A cache is derived data. Each cache file carries what proves it: a SHA-256 checksum of its content
(:func:`json_digest` for JSON, :func:`tensors_digest` for safetensors) and the identity of its inputs
(the evaluation fingerprint, the baseline answer ids a reference was forced along). A file whose
proof fails (it does not parse, it has no checksum because an older version wrote it, its checksum
or its inputs differ, or a value is implausible: a log-probability above 0, a score outside
[0, 1]) is rebuilt, and :func:`announce_rebuild` says so in one line; it is never trusted, never
mixed with fresh results, and never an error.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch


def json_digest(value: Any) -> str:
    """SHA-256 (hex) of ``value`` as canonical JSON (sorted keys, no spaces, no NaN)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


def tensors_digest(tensors: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 (hex) over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def as_json_value(value: Any) -> Any:
    """``value`` as it reads back from JSON (tuples become lists), for comparing identities."""
    return json.loads(json.dumps(value, sort_keys=True))


def announce_rebuild(path: Path, reason: str) -> None:
    """The one line said when a cache file is not trusted and is rebuilt."""
    print(f"cache {path} is not trusted ({reason}); rebuilding it", flush=True)

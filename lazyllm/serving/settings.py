"""What one server serves and how: :class:`ServeSettings`, checked once (the CLI flags have the same
names, :mod:`lazyllm.serve`)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from lazyllm.models import DEFAULT_MODEL, DTYPES

UNPRUNED = "unpruned"
"""The schedule name every server offers: the model without pruning."""

DEFAULT_SCHEDULE_NAME = "tuned"
"""The name of a schedule given as a bare path."""

API_KEY_ENV = "LAZYLLM_API_KEY"
"""The environment variable that sets ``--api-key`` (a key on the command line shows in ``ps``)."""


@dataclass(frozen=True)
class ServeSettings:
    """What one server serves and how (checked here; the CLI flags have the same names).

    Attributes:
        model: alias, checkpoint folder or hub id (:func:`lazyllm.load_model`).
        schedules: ``(name, schedule JSON)`` pairs; the first is the default. ``unpruned`` is added.
        host, port: where to listen.
        max_batch: the most requests decoded together.
        max_queue: the most requests waiting for a batch (more: 429).
        max_prompt_tokens: the longest prompt accepted (None: the model's context minus ``max_tokens``).
        max_body_bytes: the largest request body (more: 413).
        default_max_tokens: the answer length when a request gives none.
        served_model_name: the ``model`` clients name (None: ``model``).
        dtype: a name of :data:`lazyllm.models.DTYPES` (``auto``: float32 on CPU, bfloat16 on CUDA).
        device: ``cpu``, ``cuda``, ... (None: CUDA if available).
        trust_remote_code: allow a hub model's own Python code.
        api_key: the key every ``/v1`` request must send as ``Authorization: Bearer KEY`` (None: no
            key). Never printed: it is left out of the repr.
        allow_hosts: ``Host`` header names accepted besides the bound address (``*``: any).
    """

    model: str = DEFAULT_MODEL
    schedules: tuple[tuple[str, Path], ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    max_batch: int = 8
    max_queue: int = 64
    max_prompt_tokens: int | None = None
    max_body_bytes: int = 4 * 2**20
    default_max_tokens: int = 256
    served_model_name: str | None = None
    dtype: str = "auto"
    device: str | None = None
    trust_remote_code: bool = False
    api_key: str | None = field(default=None, repr=False)
    allow_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.schedules:
            raise ValueError("no schedule to serve: pass --schedule schedule.json (or NAME=PATH)")
        names = [name for name, _ in self.schedules]
        for name, path in self.schedules:
            if not name or name == UNPRUNED or names.count(name) > 1:
                raise ValueError(
                    f"schedule name {name!r}: give each --schedule NAME=PATH its own non-empty name "
                    f"(not {UNPRUNED!r}, which is always served)"
                )
            if not Path(path).is_file():
                raise ValueError(f"--schedule {path}: no such file; pass a schedule JSON")
        for flag, value in (("--max-batch", self.max_batch), ("--max-queue", self.max_queue),
                            ("--max-body-bytes", self.max_body_bytes),
                            ("--default-max-tokens", self.default_max_tokens),
                            ("--max-prompt-tokens", self.max_prompt_tokens or 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{flag} {value!r}: must be an integer >= 1")
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port {self.port}: must be in [0, 65535]")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype {self.dtype!r}: must be one of {', '.join(DTYPES)}")
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            raise ValueError(f"--api-key / ${API_KEY_ENV}: must be a non-empty string without spaces")
        for host in self.allow_hosts:
            if not host or any(c.isspace() or c in "/@" for c in host):
                raise ValueError(f"--allow-host {host!r}: give a host name, an address or *")

    @property
    def name(self) -> str:
        """The model name clients send."""
        return self.served_model_name or self.model

    @property
    def hosts(self) -> frozenset[str]:
        """``Host`` header names accepted (lower case, without the port): the bound address (with
        ``localhost`` and both loopback addresses when it is a loopback one) and ``allow_hosts``."""
        names = {self.host.lower().strip("[]"), *(h.lower().strip("[]") for h in self.allow_hosts)}
        try:
            loopback = ipaddress.ip_address(self.host.strip("[]")).is_loopback
        except ValueError:
            loopback = self.host.lower() == "localhost"
        if loopback:
            names |= {"localhost", "127.0.0.1", "::1"}
        return frozenset(names)

    @staticmethod
    def parse_schedule(spec: str) -> tuple[str, Path]:
        """``--schedule`` as ``(name, path)``: ``NAME=PATH``, or a bare path named ``tuned``."""
        name, eq, path = spec.partition("=")
        if eq and name and "/" not in name and not Path(spec).exists():
            return name, Path(path)
        return DEFAULT_SCHEDULE_NAME, Path(spec)

"""What makes a study the same study: the settings it was created with, stored once as the study's
user attr ``identity`` and read back through :meth:`StudyIdentity.of_study` (the one loader, which
migrates studies stored before a field existed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.statistics.cap import search_cap

IDENTITY_ATTR = "identity"
"""The study's user attr holding :meth:`StudyIdentity.to_dict`."""


@dataclass(frozen=True)
class StudyIdentity:
    """The settings a resumed study must share with the one that created it (see
    ``SearchSettings.study_identity``). Units: ``max_accuracy_loss`` in score points, ``max_kl`` and
    ``search_cap`` in nats (the fidelity cap the search ran with and what set it, fixed at creation:
    :func:`tuner.evaluation.losses.search_cap`)."""

    model: str
    task: str
    dtype: str = "auto"  # what a study stored before the dtype was a setting ran with
    language: str = "en"
    search_space: str = "stages"
    max_prompt_tokens: int | None = None
    n_examples: int | None = None
    max_new_tokens: int | None = None
    split_seed: int = 0
    speedup: str = "measured"
    max_accuracy_loss: float = 0.0
    accuracy: str = "score"
    max_kl: float | None = None
    revival: str = "dynamic"  # what a study stored before the policy was a setting decoded with
    timing_clock: str = "wall"
    confidence: float = 0.9
    fidelity_top_k: int = 64
    fidelity_gold: bool = False
    search_cap: float | None = None  # a study stored before: max_kl or the constant (losses.search_cap)
    search_cap_source: str = ""
    search_cap_prior: str | None = None
    task_fingerprint: str | None = None  # a prompts file's content (and long-prompt rule): never mixed
    budget_kind: str = "gold"  # agreement: a prompts file without answers (tuner.data.prompts)
    search_prompt_tokens: int | None = None  # a multi-fidelity search's trial length (none: the target)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not isinstance(self.task, str):
            raise ValueError(
                f"study identity: model and task must be strings, got {self.model!r}, {self.task!r}"
            )
        if isinstance(self.max_accuracy_loss, bool) or not isinstance(self.max_accuracy_loss, (int, float)):
            raise ValueError(
                f"study identity: max_accuracy_loss = {self.max_accuracy_loss!r} is not a number"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StudyIdentity:
        """Read a stored identity; fields added since it was stored take the meaning they had before."""
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        if "search_cap" not in data and data.get("accuracy") == "fidelity":
            # stored before the cap was recorded: it searched under --max-kl or the constant, so it
            # resumes with the settings that give that cap (--slope-prior none, or the same --max-kl)
            cap = search_cap(float(data.get("max_accuracy_loss", 0.0)), data.get("max_kl"), None)
            fields |= {"search_cap": cap.nats, "search_cap_source": cap.source, "search_cap_prior": None}
        return cls(**fields)

    @classmethod
    def of_study(cls, study: optuna.Study) -> StudyIdentity | None:
        """The identity ``study`` was created with, or None for a study this tool did not create."""
        data = study.user_attrs.get(IDENTITY_ATTR)
        if not isinstance(data, Mapping) or "model" not in data or "task" not in data:
            return None
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """Every field, but ``search_prompt_tokens`` only where a multi-fidelity search set it: a
        single-length study's identity, and ``recommended.json`` written from it, stay byte for byte
        what they were before that setting existed."""
        out = dataclasses.asdict(self)
        if out["search_prompt_tokens"] is None:
            del out["search_prompt_tokens"]
        return out

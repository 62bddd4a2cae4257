"""What a study costs in model passes, from its settings and the examples its data holds.

The formula (docs/benchmarks.md#what-a-study-costs), per dataset ``d`` with ``V_d`` validation and
``T_d`` test examples, ``n`` = ``n_examples`` (None: all), ``c`` = ``confirm_n_examples`` (None: ``n``),
``h`` = ``heldout_n_examples`` (None: ``n``), ``R`` = ``timing_rounds``:

* search prompts ``S = sum_d min(n, V_d)``; each trial prefills every one once (teacher-forced KL),
  and with ``speedup: measured`` or ``total`` times ``R`` interleaved rounds of the unpruned model and
  the schedule on one prompt: ``S + 2R`` prefills a trial (``S`` with the FLOP model), ``n_trials``
  times;
* the unpruned answers the KL is measured against: ``S``, once;
* the calibration: ``confirm_k`` schedules and the unpruned model each answer ``C = sum_d min(c, V_d)``
  validation prompts: ``(confirm_k + 1) C`` answers;
* the held-out check: the pick and the unpruned model each answer ``H = sum_d min(h, T_d)`` test
  prompts: ``2H`` answers.

Seconds follow from one prefill's and one answer's time on the hardware; decoding is not included in
:meth:`StudyCost.trial_minutes`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tuner.data.longbench import VALIDATION_FRACTION, resolve_task
from tuner.study.settings import SearchSettings

LONGBENCH_HUB_RECORDS = 200
"""Records of each LongBench v1 dataset on the hub (``THUDM/LongBench``)."""


@dataclass(frozen=True)
class StudyCost:
    """A study's model passes (see the module docstring for each term)."""

    search_prompts: int
    timing_prefills: int
    n_trials: int
    baseline_answers: int
    calibration_answers: int
    heldout_answers: int

    @property
    def trial_prefills(self) -> int:
        """Prefills of one trial: the search prompts and the timing rounds (``S + 2R``)."""
        return self.search_prompts + self.timing_prefills

    @property
    def prefills(self) -> int:
        """Prefills of all trials (``n_trials (S + 2R)``)."""
        return self.n_trials * self.trial_prefills

    @property
    def answers(self) -> int:
        """Answers generated outside the trials: the baseline's, the calibration's, the held-out check's."""
        return self.baseline_answers + self.calibration_answers + self.heldout_answers

    def trial_minutes(self, prefill_seconds: float) -> float:
        """Minutes of the trials' prefills at ``prefill_seconds`` a prefill."""
        return self.prefills * prefill_seconds / 60.0


def expected_counts(settings: SearchSettings) -> tuple[dict[str, int], dict[str, int]]:
    """Validation and test examples per dataset of ``settings.task`` on the hub, as expected from the
    split's share (:data:`tuner.data.longbench.VALIDATION_FRACTION` of :data:`LONGBENCH_HUB_RECORDS`)."""
    names = [spec.name for spec in resolve_task(settings.task, settings.language)]
    validation = round(LONGBENCH_HUB_RECORDS * VALIDATION_FRACTION)
    return dict.fromkeys(names, validation), dict.fromkeys(names, LONGBENCH_HUB_RECORDS - validation)


def _taken(limit: int | None, available: Mapping[str, int]) -> int:
    return sum(n if limit is None else min(limit, n) for n in available.values())


def study_cost(settings: SearchSettings, validation: Mapping[str, int], test: Mapping[str, int]) -> StudyCost:
    """The model passes of a study with ``settings`` on data holding ``validation`` and ``test``
    examples per dataset."""
    search = _taken(settings.n_examples, validation)
    confirm = settings.n_examples if settings.confirm_n_examples is None else settings.confirm_n_examples
    heldout = settings.n_examples if settings.heldout_n_examples is None else settings.heldout_n_examples
    timed = 0 if settings.speedup == "flops" else 2 * settings.timing_rounds
    return StudyCost(
        search_prompts=search,
        timing_prefills=timed,
        n_trials=settings.n_trials,
        baseline_answers=search,
        calibration_answers=(settings.confirm_k + 1) * _taken(confirm, validation)
        if settings.confirm_k
        else 0,
        heldout_answers=2 * _taken(heldout, test) if settings.heldout else 0,
    )

"""Optuna samplers by name: a ``name -> factory`` table; an unknown name lists the valid ones.

Every factory takes ``(seed, n_trials)``; startup (random) trials scale with the study size. All of
them honour the accuracy-loss constraint set with ``trial.set_constraint`` (Optuna >= 5).

>>> sampler_names()
['gp', 'nsga2', 'random', 'tpe']
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import optuna

SamplerFactory = Callable[[int, int], optuna.samplers.BaseSampler]


def _startup(n_trials: int) -> int:
    return max(4, min(10, n_trials // 3))


def _tpe(seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():  # `group` (needed for define-by-run stages) is experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed, multivariate=True, group=True, n_startup_trials=_startup(n_trials)
        )


def _gp(seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    # the stages space is define-by-run: GP models the parameters every trial has and samples the
    # conditional ones independently (expected, so not warned about on every trial)
    return optuna.samplers.GPSampler(
        seed=seed, n_startup_trials=_startup(n_trials), warn_independent_sampling=False
    )


def _nsga2(seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, _startup(n_trials)))


def _random(seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.RandomSampler(seed=seed)


SAMPLERS: dict[str, SamplerFactory] = {"tpe": _tpe, "gp": _gp, "nsga2": _nsga2, "random": _random}


def sampler_names() -> list[str]:
    return sorted(SAMPLERS)


def check_sampler(name: str) -> None:
    if name not in SAMPLERS:
        raise ValueError(f"Unknown sampler {name!r}. Available: {', '.join(sampler_names())}")


def make_sampler(name: str, seed: int, n_trials: int) -> optuna.samplers.BaseSampler:
    """The sampler ``name`` (see :data:`SAMPLERS`)."""
    check_sampler(name)
    return SAMPLERS[name](seed, n_trials)

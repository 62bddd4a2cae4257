"""The schedules a user would write by hand, the yardstick every study is held to.

Two families, both with today's scoring rule:

* **paper-style**: progressive pruning in equal stages from a quarter or half of the depth, keeping
  30% or 50% of the prompt at the end (LazyLLM's own recipe);
* **one-stage**: prune to ``K%`` of the prompt once, after layer ``L`` (FastKV's token-selective
  propagation: full context up to a middle layer, then only the selected tokens), ``K`` in
  10/30/50%, ``L`` a quarter or half of the depth.

The held-out check (:mod:`tuner.stages.heldout`) compares the recommendation with the best of each
family on test, and the search spaces queue the one-stage family as warm starts
(:meth:`tuner.study.spaces.SearchSpace.hand_made_starts`), so a study evaluates every one-stage schedule
its held-out check will hold it to.
"""

from __future__ import annotations

from lazyllm.schedule import Revival, Schedule

ONE_STAGE_KEEPS = (10, 30, 50)
"""Shares of the prompt (%) a one-stage hand-made schedule keeps."""


def one_stage_points(layers: int) -> list[tuple[int, int]]:
    """``(layer, keep %)`` of the one-stage family: after a quarter and half of the depth (a layer
    that can prune, so not the last), keeping each of :data:`ONE_STAGE_KEEPS`.

    >>> one_stage_points(8)[:2]
    [(2, 10), (2, 30)]
    """
    return [
        (layer, keep)
        for layer in sorted({max(0, layers // 4), max(0, layers // 2)})
        if layer < layers - 1
        for keep in ONE_STAGE_KEEPS
    ]


def hand_made_grid(model_name: str, layers: int) -> dict[str, Schedule]:
    """Paper-style progressive schedules a user might write by hand, by name."""
    grid = {}
    for start in sorted({layers // 4, layers // 2}):
        for keep in (0.3, 0.5):
            stages = max(1, min(4, layers - 1 - start))
            grid[f"paper start={start} keep={keep}"] = Schedule.progressive(
                model_name, layers, start_layer=start, final_keep=keep, stages=stages
            )
    return grid


def one_stage_grid(model_name: str, layers: int) -> dict[str, Schedule]:
    """FastKV-style one-stage schedules: keep ``K%`` of the prompt after layer ``L``.

    >>> sorted(one_stage_grid("m", 8))[:2]
    ['one-stage keep=10% after layer 2', 'one-stage keep=10% after layer 4']
    """
    return {
        f"one-stage keep={keep}% after layer {layer}": Schedule.from_layers(
            model_name, layers, {layer: 100 - keep}
        )
        for layer, keep in one_stage_points(layers)
    }


def families(model_name: str, layers: int, revival: Revival) -> dict[str, dict[str, Schedule]]:
    """Both hand-made families, each schedule with the study's revival policy."""
    grids = {
        "paper-style": hand_made_grid(model_name, layers),
        "one-stage": one_stage_grid(model_name, layers),
    }
    return {f: {n: s.with_revival(revival) for n, s in g.items()} for f, g in grids.items()}

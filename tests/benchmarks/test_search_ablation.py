"""benchmarks/search_ablation.py: the test-split command each row carries is one tuner.evaluate takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import load_benchmark
from tuner.evaluate import _parser

search_ablation = load_benchmark("search_ablation")


@pytest.mark.parametrize("arm", ["warm", "both"])
def test_the_evaluate_command_drops_the_search_only_flags(arm: str, tmp_path: Path) -> None:
    argv = search_ablation.study_argv("openqa", 0, "lb", "oq", tmp_path)
    if arm == "warm":  # prepare() adds the warm starts' count for this arm
        argv = [*argv, "--n-trials", "11"]
    flags = search_ablation.evaluate_flags(argv)
    assert "--n-trials" not in flags and "--tracking-uri" not in flags and "none" not in flags
    args = _parser().parse_args([*flags, "--split", "test", "--methods", "baseline,lazyllm"])
    assert args.seed == 0 and args.split == "test"

"""lazyllm.text.StopCriteria: EOS ids, stop strings and the returned text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lazyllm.text import StopCriteria


class _Tok:
    eos_token_id = 9

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(
            "\n" if i == 0 else chr(ord("a") + i) for i in ids if not (skip_special_tokens and i == 9)
        )


def test_eos_ids_come_from_the_argument_then_the_model_then_the_tokenizer() -> None:
    with_config = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=[3, 4]))
    no_config = SimpleNamespace(generation_config=SimpleNamespace(eos_token_id=None))
    assert StopCriteria.build(with_config, _Tok(), 7, ()).eos_ids == {7}
    assert StopCriteria.build(with_config, _Tok(), None, ()).eos_ids == {3, 4}
    assert StopCriteria.build(no_config, _Tok(), None, ()).eos_ids == {9}
    assert StopCriteria.build(no_config, None, None, ()).eos_ids == set()


def test_check_and_text() -> None:
    stop = StopCriteria.build(SimpleNamespace(), _Tok(), 9, ["\n"])
    assert stop.check([1, 2]) is None
    assert stop.check([1, 9]) == "eos"
    assert stop.check([1, 0, 2]) == "stop_string"
    assert stop.text([1, 2, 0, 3]) == "bc"  # cut before the first stop string
    assert stop.text([1, 2, 9]) == "bc"  # special tokens skipped
    assert StopCriteria.build(SimpleNamespace(), None, 9, ()).text([1]) is None


def test_bad_stop_strings() -> None:
    with pytest.raises(ValueError, match="stop_strings need a tokenizer"):
        StopCriteria.build(SimpleNamespace(), None, 9, ["x"])
    with pytest.raises(ValueError, match="empty string"):
        StopCriteria.build(SimpleNamespace(), _Tok(), 9, [""])

"""lazyllm.serving.protocol: OpenAI bodies checked into typed records (no server; the HTTP side is test_serve)."""

from __future__ import annotations

from typing import Any

import pytest

from lazyllm.sampling import Sampling
from lazyllm.serving.protocol import APIError, check_chat_request, check_completion_request

MESSAGES = [{"role": "user", "content": "hi"}]


def test_defaults_and_nulls_take_openais_meaning() -> None:
    checked = check_chat_request(
        {"messages": MESSAGES, "temperature": None, "stop": None}, default_max_tokens=9
    )
    decoding = checked.decoding
    assert decoding.max_tokens == 9 and decoding.stop == () and not decoding.stream
    assert decoding.sampling == Sampling(
        do_sample=True, temperature=1.0, top_k=0
    )  # OpenAI samples by default
    greedy = check_chat_request({"messages": MESSAGES, "temperature": 0, "stop": "\n"}, default_max_tokens=9)
    assert greedy.decoding.sampling.greedy and greedy.decoding.stop == ("\n",)
    streamed = check_chat_request(
        {"messages": MESSAGES, "stream": True, "stream_options": {"include_usage": True}},
        default_max_tokens=9,
    )
    assert streamed.decoding.stream and streamed.decoding.include_usage
    text = check_completion_request({"prompt": ["one prompt"], "max_tokens": 3}, default_max_tokens=16)
    assert text.prompt == "one prompt" and text.decoding.max_tokens == 3


@pytest.mark.parametrize(
    ("body", "param", "said"),
    [
        (
            {"messages": MESSAGES, "stream_options": {"include_usage": True}},
            "stream_options",
            "only allowed with stream",
        ),
        ({"messages": MESSAGES, "max_completion_tokens": 2, "max_tokens": 2}, "max_tokens", "not both"),
        ({"messages": MESSAGES, "top_p": 0}, "top_p", "top_p = 0.0: must be in (0, 1]"),
        ({"messages": MESSAGES, "schedule": "tuned"}, "schedule", "unsupported fields ['schedule']"),
        ({"messages": MESSAGES, "logprobs": True}, "logprobs", "logprobs = True is not supported"),
    ],
)
def test_bad_chat_bodies_name_the_field(body: dict[str, Any], param: str, said: str) -> None:
    # schedules=None: the pyfunc model's view, where `schedule` is not a field
    with pytest.raises(APIError) as caught:
        check_chat_request(body, default_max_tokens=4)
    assert caught.value.param == param and said in caught.value.message and caught.value.status == 400


def test_the_model_and_the_schedule_are_checked_where_the_server_names_them() -> None:
    options: dict[str, Any] = {
        "default_max_tokens": 4,
        "models": ["tiny"],
        "schedules": ["tuned", "unpruned"],
    }
    assert (
        check_chat_request(
            {"model": "tiny", "messages": MESSAGES, "schedule": "unpruned"}, **options
        ).decoding.schedule
        == "unpruned"
    )
    with pytest.raises(APIError) as caught:
        check_chat_request({"model": "gpt-4o", "messages": MESSAGES}, **options)
    assert caught.value.status == 404 and caught.value.code == "model_not_found"
    assert caught.value.body()["error"]["param"] == "model"
    with pytest.raises(APIError, match="model is missing; give one of: tiny"):
        check_completion_request({"prompt": "x"}, **options)
    with pytest.raises(APIError, match="prompt = 7"):
        check_completion_request({"model": "tiny", "prompt": 7}, **options)

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
    # what load testers (GuideLLM) send, as vLLM takes it
    load = check_completion_request(
        {"prompt": "x", "stream": True, "stop": None, "ignore_eos": True,
         "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        default_max_tokens=16,
    )  # fmt: skip
    assert load.decoding.ignore_eos and load.decoding.include_usage and not text.decoding.ignore_eos


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


_MSG = {"messages": MESSAGES}
_SERVER: dict[str, Any] = {"default_max_tokens": 4, "models": ["tiny"], "schedules": ["tuned", "unpruned"]}


@pytest.mark.parametrize(
    ("kind", "body", "status", "param", "said"),
    [
        ("chat", {**_MSG, "temperature": 1e-300}, 400, "temperature", "a positive one at least 1e-05"),
        ("chat", {**_MSG, "temperature": 2.5}, 400, "temperature", "temperature = 2.5: must be in [0, 2]"),
        ("chat", {**_MSG, "temperature": float("nan")}, 400, "temperature", "must be a finite number"),
        ("chat", {**_MSG, "temperature": "hot"}, 400, "temperature", "temperature = 'hot': must be a number"),
        ("chat", {**_MSG, "top_p": 1.5}, 400, "top_p", "top_p = 1.5: must be in (0, 1]"),
        ("chat", {**_MSG, "top_p": float("inf")}, 400, "top_p", "must be a finite number"),
        ("chat", {**_MSG, "repetition_penalty": 1e-300}, 400, "repetition_penalty", "must be in [0.01, 100]"),
        ("chat", {**_MSG, "repetition_penalty": 1000}, 400, "repetition_penalty", "must be in [0.01, 100]"),
        ("chat", {**_MSG, "top_k": -1}, 400, "top_k", "top_k = -1: must be an integer >= 0"),
        ("chat", {**_MSG, "seed": 2**63}, 400, "seed", "must be an integer in [0, 2**63)"),
        ("chat", {**_MSG, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "at most 4 strings"),
        ("chat", {**_MSG, "stop": "x" * 129}, 400, "stop", "of at most 128 characters"),
        ("chat", {**_MSG, "stop": [""]}, 400, "stop", "must be a non-empty string or a list of them"),
        ("chat", {**_MSG, "n": 2}, 400, "n", "only one choice per request"),
        ("chat", {**_MSG, "max_tokens": 0}, 400, "max_tokens", "max_tokens = 0: must be an integer >= 1"),
        (
            "chat",
            {**_MSG, "max_completion_tokens": 1.5},
            400,
            "max_completion_tokens",
            "must be an integer >= 1",
        ),
        ("chat", {**_MSG, "stream": "yes"}, 400, "stream", "must be true or false"),
        (
            "chat",
            {**_MSG, "presence_penalty": 0.5},
            400,
            "presence_penalty",
            "is not supported; leave it out",
        ),
        ("chat", {**_MSG, "tools": []}, 400, "tools", "unsupported fields ['tools']"),
        ("chat", {**_MSG, "\ud800": 1}, 400, None, "a lone surrogate"),
        (
            "chat",
            {"messages": [{"role": "user", "content": "hi \udfff"}]},
            400,
            "messages",
            "a lone surrogate",
        ),
        ("chat", [1, 2], 400, None, "must be a JSON object, not list"),
        ("chat", {"messages": []}, 400, "messages", "non-empty list"),
        (
            "chat",
            {"messages": [{"role": "robot", "content": "x"}]},
            400,
            "messages",
            "messages[0].role = 'robot'",
        ),
        ("chat", {**_MSG, "model": "gpt-4o"}, 404, "model", "'gpt-4o' does not exist"),
        (
            "chat",
            {**_MSG, "model": "tiny", "schedule": "fast"},
            400,
            "schedule",
            "schedule = 'fast' is unknown",
        ),
        ("completion", {"model": "tiny", "prompt": ["one", "two"]}, 400, "prompt", "one prompt per request"),
        (
            "completion",
            {"model": "tiny", "prompt": "x", "echo": True},
            400,
            "echo",
            "echo = True is not supported",
        ),
        ("completion", {"model": "tiny", "prompt": "x", "logprobs": 2}, 400, "logprobs", "logprobs = 2"),
        (
            "completion",
            {"model": "tiny", "prompt": "x", "suffix": "\ud800"},
            400,
            "suffix",
            "a lone surrogate",
        ),
    ],
)
def test_each_bad_body_is_refused_naming_its_field(
    kind: str, body: Any, status: int, param: str | None, said: str
) -> None:
    check = check_chat_request if kind == "chat" else check_completion_request
    with pytest.raises(APIError) as caught:
        check(body, **{**_SERVER, "models": ["tiny"] if "model" in body else None})
    error = caught.value
    assert (error.status, error.param) == (status, param) and said in error.message, error.body()
    assert error.body()["error"]["type"] == "invalid_request_error"


def test_the_pydantic_models_refuse_in_the_same_words() -> None:
    """FastAPI validates bodies with ChatBody/CompletionBody; their errors carry the field and message."""
    from pydantic import ValidationError

    from lazyllm.serving.protocol import ChatBody, CompletionBody

    with pytest.raises(ValidationError) as caught:
        ChatBody.model_validate({**_MSG, "temperature": 7})
    error = APIError.from_validation(caught.value.errors())
    assert error.param == "temperature" and "temperature = 7.0: must be in [0, 2]" in error.message
    assert CompletionBody.model_validate({"prompt": "x", "stop": ["a"], "temperature": 0}).stop == ["a"]
    schema = ChatBody.model_json_schema()
    assert schema["properties"]["temperature"]["anyOf"][0]["maximum"] == 2

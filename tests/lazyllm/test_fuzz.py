"""schemathesis against the server's own OpenAPI schema, in process (ASGI, no network): bodies that
follow the schema and bodies that break it, on every route; none may get a 5xx, and every refusal is
OpenAI's error object. Bounded: a few dozen examples per route on a tiny model whose context (64
positions) keeps every accepted generation short."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

from lazyllm.engine import LazyLLM
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from lazyllm.serving.app import Served, create_app
from lazyllm.serving.settings import ServeSettings

EXAMPLES = 25  # per route and mode
ROUTES = [
    ("/v1/chat/completions", "POST"),
    ("/v1/completions", "POST"),
    ("/v1/models", "GET"),
    ("/health", "GET"),
]


@pytest.fixture(scope="module")
def schema(tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    file = Schedule("tiny", (0.0, 50.0, 30.0, 0.0), revival="frozen").save(
        tmp_path_factory.mktemp("fuzz") / "s.json"
    )
    settings_ = ServeSettings(model=str(tiny_folder), schedules=(("tuned", file),), served_model_name="tiny",
                              default_max_tokens=4, allow_hosts=("testserver",))  # fmt: skip
    engines = {
        name: LazyLLM(model, s, tokenizer=tokenizer, strict_model_name=False)
        for name, s in (("tuned", Schedule.load(file)), ("unpruned", Schedule.keep_all("tiny", 4)))
    }
    served = Served.of(settings_, engines, tokenizer, context=64)
    app = create_app(settings_, served)

    async def without_lifespan(scope: Any, receive: Any, send: Any) -> None:
        """The app, its lifespan answered here: schemathesis' pytest plugin ends an app's lifespan
        after each test, which would stop the queue for the next; the fixture owns it instead."""
        if scope["type"] != "lifespan":
            return await app(scope, receive, send)
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return None

    served.queue.start()
    yield schemathesis.openapi.from_asgi("/openapi.json", without_lifespan)
    served.queue.stop(timeout=30)


def test_the_schema_describes_the_bodies(schema: Any) -> None:
    body = schema.raw_schema["components"]["schemas"]
    assert {"ChatBody", "CompletionBody", "ChatMessage"} <= set(body)
    temperature = body["ChatBody"]["properties"]["temperature"]["anyOf"][0]
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize(("path", "method"), ROUTES)
def test_no_generated_request_gets_a_5xx(schema: Any, path: str, method: str, mode: GenerationMode) -> None:
    operation = schema[path][method]
    if method == "GET" and mode is GenerationMode.NEGATIVE:
        pytest.skip("a GET route takes no input to break")
    seen: list[int] = []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        response = case.call()
        seen.append(response.status_code)
        assert response.status_code < 500, (case.body, response.text)
        if response.status_code >= 400:
            error = response.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}, error

    check()
    assert seen

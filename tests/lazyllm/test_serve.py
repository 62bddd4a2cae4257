"""``python -m lazyllm.serve`` through the official ``openai`` client: a real server subprocess on
127.0.0.1 serving a tiny random-init checkpoint (one start per module), answers compared with the
engine's own in this process."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from lazyllm.engine import LazyLLM
from lazyllm.models import load_model
from lazyllm.schedule import Schedule
from tests.support import served

SCHEDULE = Schedule("tiny", (0.0, 50.0, 30.0, 0.0), revival="frozen")
DYNAMIC = Schedule("tiny", (0.0, 50.0, 30.0, 0.0), revival="dynamic")  # revives: decoded alone
MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}]
PROMPT_CAP = 300


@dataclass(frozen=True)
class Server:
    """A running server, its model name, and engines of the same checkpoint in this process."""

    base: str
    model: str
    engines: dict[str, LazyLLM]

    def client(self, **options: Any) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base + "/v1", api_key="unused", **options)

    def health(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/health", timeout=30) as resp:
            return dict(json.loads(resp.read()))


@pytest.fixture(scope="module")
def engines(tiny_folder: Path) -> dict[str, LazyLLM]:
    model, tokenizer = load_model(str(tiny_folder), device="cpu")
    keep_all = Schedule.keep_all("tiny", SCHEDULE.num_layers)
    return {
        name: LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)
        for name, schedule in (("tuned", SCHEDULE), ("unpruned", keep_all), ("dynamic", DYNAMIC))
    }


def _start(tiny_folder: Path, tmp: Path, *flags: str) -> Any:
    schedule = SCHEDULE.save(tmp / "schedule.json")
    dynamic = DYNAMIC.save(tmp / "dynamic.json")
    args = ["--model", str(tiny_folder), "--schedule", str(schedule), "--schedule", f"dynamic={dynamic}",
            "--served-model-name", "tiny", *flags]  # fmt: skip
    return served("lazyllm.serve", args, tmp / "serve.log")


@pytest.fixture(scope="module")
def server(
    tiny_folder: Path, tmp_path_factory: pytest.TempPathFactory, engines: dict[str, LazyLLM]
) -> Iterator[Server]:
    """One server for every test here but the queue's (each start costs seconds)."""
    tmp = tmp_path_factory.mktemp("serve")
    with _start(tiny_folder, tmp, "--max-batch", "8", "--max-prompt-tokens", str(PROMPT_CAP)) as base:
        yield Server(base, "tiny", engines)


def test_blocking_chat_and_completion_are_the_engines_answers(server: Server) -> None:
    client = server.client()
    tuned, unpruned = server.engines["tuned"], server.engines["unpruned"]
    answer = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    expected = tuned.generate(MESSAGES, max_new_tokens=8)
    assert answer.object == "chat.completion" and answer.id.startswith("chatcmpl-")
    assert answer.choices[0].message.content == expected.text and expected.text
    assert answer.choices[0].finish_reason == "length"
    n = expected.prompt_tokens
    assert answer.usage is not None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
        n,
        8,
        n + 8,
    )
    extension = answer.model_extra["lazyllm"]  # type: ignore[index]
    assert extension["schedule"] == "tuned" and extension["revival"] == "frozen"
    assert extension["prompt_computed_fraction"] == pytest.approx(expected.prompt_computed_fraction)
    assert extension["prompt_computed_fraction"] < 1.0 and extension["ttft_s"] > 0
    # the unpruned model through the same server, chosen per request
    full = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, extra_body={"schedule": "unpruned"}
    )
    assert full.choices[0].message.content == unpruned.generate(MESSAGES, max_new_tokens=8).text
    assert full.model_extra["lazyllm"]["prompt_computed_fraction"] == 1.0  # type: ignore[index]
    # completions: the raw prompt, no chat template
    text = client.completions.create(
        model="tiny", prompt="The capital of France is", max_tokens=6, temperature=0
    )
    raw = tuned.generate("The capital of France is", max_new_tokens=6, chat=False)
    assert text.object == "text_completion" and text.choices[0].text == raw.text
    # the tokenizer's own count: a chat template would add its role markers
    own = len(tuned.tokenizer("The capital of France is")["input_ids"])
    assert text.usage is not None and text.usage.prompt_tokens == raw.prompt_tokens == own


def test_a_schedule_that_revives_tokens_is_served_too(server: Server) -> None:
    client = server.client()
    kwargs: dict[str, Any] = dict(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    answer = client.chat.completions.create(**kwargs, extra_body={"schedule": "dynamic"})
    expected = server.engines["dynamic"].generate(MESSAGES, max_new_tokens=8)
    assert answer.choices[0].message.content == expected.text
    assert answer.model_extra["lazyllm"]["revival"] == "dynamic"  # type: ignore[index]
    stream = client.chat.completions.create(**kwargs, stream=True, extra_body={"schedule": "dynamic"})
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expected.text


def test_sampled_answer_is_the_engines_with_the_same_seed(server: Server) -> None:
    answer = server.client().chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=8, temperature=0.9, top_p=0.95, seed=11
    )
    expected = server.engines["tuned"].generate(
        MESSAGES, max_new_tokens=8, do_sample=True, temperature=0.9, top_p=0.95, top_k=0, seed=11
    )
    assert answer.choices[0].message.content == expected.text


def test_stream_joins_to_the_blocking_text_with_usage_last(server: Server) -> None:
    client = server.client()
    # a stop string that never comes: the stream holds back its length less one character until the end
    stop = ["<no such text>"]
    blocking = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stop=stop
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stop=stop, stream=True,
            stream_options={"include_usage": True},
        )
    )  # fmt: skip
    assert len(chunks) > 3 and all(
        c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == blocking.choices[0].message.content
    *_, finish, last = chunks
    assert finish.choices[0].finish_reason == blocking.choices[0].finish_reason
    assert finish.model_extra["lazyllm"]["prompt_computed_fraction"] < 1.0  # type: ignore[index]
    assert last.choices == [] and last.usage == blocking.usage
    # on the wire: OpenAI's events, every chunk but the usage one with "usage": null
    events = _events(server.base, "/v1/chat/completions", {"model": "tiny", "messages": MESSAGES, "max_tokens": 4,
                     "temperature": 0, "stream": True, "stream_options": {"include_usage": True}})  # fmt: skip
    assert events[-1] == "[DONE]" and len(events) > 3
    *rest, usage = [json.loads(e) for e in events[:-1]]
    assert all("usage" in e and e["usage"] is None for e in rest) and usage["usage"]["completion_tokens"] == 4
    # text completions stream alike
    kwargs: dict[str, Any] = dict(model="tiny", prompt="Once upon a time", max_tokens=10, temperature=0)
    pieces = list(client.completions.create(**kwargs, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == client.completions.create(**kwargs).choices[0].text
    assert all(p.usage is None for p in pieces)  # no usage chunk unless asked


def test_models_list_and_the_async_client(server: Server) -> None:
    listed = server.client().models.list()
    assert [m.id for m in listed.data] == ["tiny"]
    assert listed.data[0].model_extra["lazyllm"]["schedules"] == ["tuned", "dynamic", "unpruned"]  # type: ignore[index]

    async def ask() -> str | None:
        client = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused")
        answer = await client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=5, temperature=0
        )
        return answer.choices[0].message.content

    assert asyncio.run(ask()) == server.engines["tuned"].generate(MESSAGES, max_new_tokens=5).text


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Question {i}: " + "tell me more " * (3 * i + 1)}]


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(server: Server) -> None:
    client = server.client()
    alone = [
        client.chat.completions.create(model="tiny", messages=_messages(i), max_tokens=10, temperature=0)
        for i in range(8)
    ]
    assert all(a.model_extra["lazyllm"]["batch_size"] == 1 for a in alone)  # type: ignore[index]
    assert len({a.choices[0].message.content for a in alone}) > 1  # different prompts, different answers

    async def together() -> list[Any]:
        aclient = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused")
        return await asyncio.gather(
            *(aclient.chat.completions.create(model="tiny", messages=_messages(i), max_tokens=10, temperature=0)
              for i in range(8))
        )  # fmt: skip

    answers = asyncio.run(together())
    assert [a.choices[0].message.content for a in answers] == [a.choices[0].message.content for a in alone]
    sizes = [a.model_extra["lazyllm"]["batch_size"] for a in answers]
    assert max(sizes) > 1, sizes  # decoded together, not one after another
    assert server.health()["largest_batch"] >= max(sizes)


def _raw(base: str, path: str, data: bytes) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_malformed_requests_get_openai_errors_and_the_server_keeps_serving(server: Server) -> None:
    client = server.client(max_retries=0)
    cases: list[tuple[Callable[[], Any], int, str | None, str]] = [
        (lambda: client.chat.completions.create(model="tiny", messages=[]), 400, "messages", "non-empty list"),
        (lambda: client.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "hi"}]),  # type: ignore[list-item]
         400, "messages", "messages[0].role = 'robot'"),
        (lambda: client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=-3), 400,
         "max_tokens", "max_tokens = -3: must be an integer >= 1"),
        (lambda: client.chat.completions.create(model="tiny", messages=MESSAGES, extra_body={"schedule": "fast"}),
         400, "schedule", "schedule = 'fast' is unknown; available: tuned, dynamic, unpruned"),
        (lambda: client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[]), 400, "tools",
         "unsupported fields ['tools']"),
        (lambda: client.completions.create(model="tiny", prompt="hi", echo=True), 400, "echo", "echo = True"),
        (lambda: client.chat.completions.create(model="gpt-4o", messages=MESSAGES), 404, "model", "'gpt-4o' does not exist"),
        (lambda: client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * 5_000_000}]),
         413, None, "more than 4194304 bytes"),
        (lambda: client.completions.create(model="tiny", prompt="word " * 400, max_tokens=4), 400, "prompt",
         f"the limit is {PROMPT_CAP} prompt tokens (--max-prompt-tokens {PROMPT_CAP})"),
    ]  # fmt: skip
    for call, status, param, said in cases:
        with pytest.raises(openai.APIStatusError) as caught:
            call()
        error = caught.value
        assert error.status_code == status, (said, error)
        assert set(error.body) == {"message", "type", "param", "code"}, error.body  # type: ignore[arg-type]
        assert said in error.body["message"] and error.param == param, error.body  # type: ignore[index]
        # and the server still answers
        ok = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, temperature=0)
        assert ok.choices[0].finish_reason == "length"
    # what the client cannot send: a body that is not JSON, or not an object
    for data, said in [(b"{not json", "not valid JSON"), (b"[1, 2]", "must be a JSON object")]:
        status, body = _raw(server.base, "/v1/chat/completions", data)
        assert status == 400 and said in body["error"]["message"], body
    assert server.health()["status"] == "ok"


def _events(base: str, path: str, body: dict[str, Any]) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, checked to be ``data: ...`` lines each
    followed by a blank line."""
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        text = resp.read().decode()
    blocks = text.split("\n\n")
    assert blocks[-1] == "" and all(b.startswith("data: ") and "\n" not in b for b in blocks[:-1]), text
    return [b[len("data: ") :] for b in blocks[:-1]]


def _generated(server: Server) -> int:
    return int(server.health()["generated_tokens"])


def _settled(server: Server, until: Callable[[dict[str, Any]], bool] = lambda _: True) -> dict[str, Any]:
    """``/health`` once nothing runs or waits and ``until`` holds (bounded: a test failure, not a hang,
    if it never settles)."""
    for _ in range(600):
        health = server.health()
        if health["running"] == 0 and health["waiting"] == 0 and until(health):
            return health
        time.sleep(0.05)
    raise AssertionError(f"the server never settled: {health}")


def test_a_client_that_disconnects_stops_costing_compute(server: Server) -> None:
    client = server.client()
    long = 300
    probe = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=long, temperature=0)
    assert probe.choices[0].finish_reason == "length"  # uncancelled, it would run all `long` tokens
    before = _settled(server)
    body = json.dumps({"model": "tiny", "prompt": "Once upon a time", "max_tokens": long, "temperature": 0,
                       "stream": True}).encode()  # fmt: skip
    request = urllib.request.Request(
        server.base + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        for _ in range(6):  # a few events, then the client goes
            assert resp.readline()
    after = _settled(server)
    spent = after["generated_tokens"] - before["generated_tokens"]
    assert spent < long // 2, spent  # cancelled within a few tokens of the disconnect
    assert after["cancelled"] == before["cancelled"] + 1
    time.sleep(0.5)
    assert _generated(server) == after["generated_tokens"]  # nothing runs on
    # a blocking request whose client gives up is cancelled too (the server checks every half second)
    impatient = server.client(timeout=1.0, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model="tiny", prompt="Once upon a time", max_tokens=3000, temperature=0)
    # (the server may see the request after the client gave up: wait for its cancellation)
    settled = _settled(server, until=lambda h: h["cancelled"] == after["cancelled"] + 1)
    assert settled["generated_tokens"] - after["generated_tokens"] < 3000 // 2


def test_a_full_queue_gets_429_with_retry_after(
    tiny_folder: Path, tmp_path: Path, engines: dict[str, LazyLLM]
) -> None:
    with _start(tiny_folder, tmp_path, "--max-batch", "1", "--max-queue", "1") as base:
        server = Server(base, "tiny", engines)
        client = server.client(max_retries=0)
        kwargs: dict[str, Any] = dict(model="tiny", prompt="Once upon a time", temperature=0)
        running = client.completions.create(**kwargs, max_tokens=2000, stream=True)
        next(iter(running))  # the first request holds the only batch slot
        waiting: list[Any] = []
        thread = threading.Thread(
            target=lambda: waiting.append(client.completions.create(**kwargs, max_tokens=3))
        )
        thread.start()
        for _ in range(600):  # until the second one waits in the queue (bounded)
            if server.health()["waiting"] == 1:
                break
            time.sleep(0.05)
        assert server.health()["waiting"] == 1
        with pytest.raises(openai.RateLimitError) as caught:
            client.completions.create(**kwargs, max_tokens=3)
        assert caught.value.status_code == 429
        assert caught.value.response.headers["retry-after"] == "1"
        assert caught.value.body["type"] == "rate_limit_error"  # type: ignore[index]
        running.close()  # the first client goes; the waiting one is served next
        thread.join(timeout=120)
        assert waiting and waiting[0].choices[0].finish_reason == "length"
        # a stream still open when the server is stopped (SIGTERM) does not keep it alive
        left_open = client.completions.create(**kwargs, max_tokens=3500, stream=True)
        next(iter(left_open))
    # stopped by SIGTERM, not by the SIGKILL that follows 20 s later
    assert "Finished server process" in (tmp_path / "serve.log").read_text(), "the server was killed"


def test_bad_flags_are_one_line_errors_before_the_model_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lazyllm.serve import main

    schedule = str(SCHEDULE.save(tmp_path / "s.json"))
    for argv, said in [
        (["--schedule", str(tmp_path / "missing.json")], "missing.json: no such file"),
        (["--schedule", f"unpruned={schedule}"], "schedule name 'unpruned'"),
        (["--schedule", f"a={schedule}", "--schedule", f"a={schedule}"], "schedule name 'a'"),
        (["--schedule", schedule, "--max-batch", "0"], "--max-batch 0: must be an integer >= 1"),
    ]:
        assert main(["--model", "/nonexistent/model", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err


@pytest.mark.integration
def test_smollm2_served_answers_as_the_engine(smollm2: tuple[Any, Any], tmp_path: Path) -> None:
    """The packaged SmolLM2 with its real chat template, through the server and the official client."""
    model, tokenizer = smollm2
    schedule = Schedule.paper_style("smollm2-135m", int(model.config.num_hidden_layers)).with_revival(
        "frozen"
    )
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
    expected = LazyLLM(model, schedule, tokenizer=tokenizer).generate(messages, max_new_tokens=8)
    args = [
        "--model",
        "smollm2-135m",
        "--schedule",
        str(schedule.save(tmp_path / "s.json")),
        "--device",
        "cpu",
    ]
    with served("lazyllm.serve", args, tmp_path / "serve.log") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused")
        answer = client.chat.completions.create(
            model="smollm2-135m",
            messages=messages,
            max_tokens=8,
            temperature=0,  # type: ignore[arg-type]
        )
    assert answer.choices[0].message.content == expected.text and expected.text.strip()
    assert answer.usage is not None and answer.usage.prompt_tokens == expected.prompt_tokens


def _post(
    base: str, path: str, data: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    """A raw POST (any bytes, any headers): the status and the JSON answer."""
    request = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_poisoned_request_gets_400_and_its_neighbours_their_solo_answers(server: Server) -> None:
    greedy = [_messages(i) for i in range(7)]
    solo = [server.engines["tuned"].generate(m, max_new_tokens=8).text for m in greedy]

    async def together() -> list[Any]:
        aclient = openai.AsyncOpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
        calls: list[Any] = [aclient.chat.completions.create(model="tiny", messages=m, max_tokens=8, temperature=0)
                            for m in greedy]  # fmt: skip
        calls.insert(3, aclient.chat.completions.create(model="tiny", messages=MESSAGES, temperature=1e-300))
        calls.insert(5, aclient.chat.completions.create(
            model="tiny", messages=MESSAGES, extra_body={"repetition_penalty": 1e-300}))  # fmt: skip
        calls.insert(6, asyncio.to_thread(_post, server.base, "/v1/chat/completions",
                     b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": NaN}'))  # fmt: skip
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(together())
    poisoned = [answers.pop(6), answers.pop(5), answers.pop(3)]
    assert [a.choices[0].message.content for a in answers] == solo
    (status, body), *errors = poisoned
    assert status == 400 and body["error"]["param"] == "top_p" and "finite" in body["error"]["message"]
    for error, param in zip(errors, ("repetition_penalty", "temperature")):
        assert isinstance(error, openai.BadRequestError) and error.param == param, error


def test_hostile_bodies_are_4xx_openai_errors(server: Server) -> None:
    cases: list[tuple[str, bytes, dict[str, str], int, str]] = [
        ("/v1/completions", b"[" * 100_000, {}, 400, "not valid JSON"),
        ("/v1/chat/completions", b'{"\\ud800": 1, "messages": []}', {}, 400, "lone surrogate"),
        ("/v1/completions", b'{"model": "tiny", "prompt": "\\ud800"}', {}, 400, "lone surrogate"),
        ("/v1/completions", b'{"model": "tiny", "prompt": "hi"}', {"Content-Type": "text/plain"}, 415, "application/json"),
        ("/v1/completions", b"", {}, 400, "body"),
        ("/v1/chat/completions", b'{"model": "tiny", "messages": [{"role": "user", "content": 5}]}', {}, 400, "content"),
    ]  # fmt: skip
    for path, data, headers, status, said in cases:
        got, body = _post(server.base, path, data, headers)
        assert got == status and said in body["error"]["message"], (data[:40], got, body)
        assert set(body["error"]) == {"message", "type", "param", "code"}
    assert server.health()["status"] == "ok"


def test_32_streams_half_dropped_leave_the_others_their_solo_text_and_no_429(server: Server) -> None:
    prompts = [f"Story {i}: once upon a time" for i in range(32)]
    solo = {
        i: server.engines["tuned"].generate(p, max_new_tokens=12, chat=False).text
        for i, p in enumerate(prompts)
        if i % 2
    }

    def read(i: int) -> str | None:
        client = server.client(max_retries=0)
        stream = client.completions.create(
            model="tiny", prompt=prompts[i], max_tokens=12, temperature=0, stream=True
        )
        pieces = []
        for n, chunk in enumerate(stream):
            pieces.append(chunk.choices[0].text)
            if i % 2 == 0 and n == 2:
                stream.close()  # the client goes after 3 chunks
                return None
        return "".join(pieces)

    with ThreadPoolExecutor(32) as pool:
        texts = list(pool.map(read, range(32)))
    assert {i: t for i, t in enumerate(texts) if i % 2} == solo
    health = _settled(server)
    assert health["running"] == 0 and health["waiting"] == 0
    later = server.client(max_retries=0).completions.create(
        model="tiny", prompt="x", max_tokens=2, temperature=0
    )
    assert later.choices[0].finish_reason == "length"  # no 429


def test_a_short_request_behind_a_long_one_finishes_first(server: Server) -> None:
    client = server.client(max_retries=0)
    long = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=1500, temperature=0,
                                     stream=True)  # fmt: skip
    chunks = iter(long)
    next(chunks)  # the long request decodes
    short = client.completions.create(model="tiny", prompt="Hi", max_tokens=4, temperature=0)
    assert short.choices[0].finish_reason == "length"
    assert short.model_extra["lazyllm"]["batch_size"] == 2  # type: ignore[index]
    # the long one still decodes: the short row leaves at the worker's next step, which may come just
    # after its answer reached the client (bounded wait, as in _settled)
    for _ in range(600):
        if (running := server.health()["running"]) == 1:
            break
        time.sleep(0.05)
    assert running == 1
    long.close()
    _settled(server)


def test_metrics_count_requests_and_tokens(server: Server) -> None:
    server.client().completions.create(model="tiny", prompt="Hi", max_tokens=3, temperature=0)
    with urllib.request.urlopen(server.base + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    assert 'lazyllm_requests_total{route="/v1/completions",status="200"}' in text
    for name in ("lazyllm_queue_waiting", "lazyllm_requests_running", "lazyllm_batch_size_bucket",
                 "lazyllm_time_to_first_token_seconds_bucket", "lazyllm_inter_token_latency_seconds_bucket",
                 "lazyllm_prompt_computed_fraction_bucket"):  # fmt: skip
        assert name in text, name


def test_the_api_key_and_the_host_are_checked(
    tiny_folder: Path, tmp_path: Path, engines: dict[str, LazyLLM]
) -> None:
    key = "sk-test-0123456789"
    schedule = SCHEDULE.save(tmp_path / "schedule.json")
    args = ["--model", str(tiny_folder), "--schedule", str(schedule), "--served-model-name", "tiny"]
    with served("lazyllm.serve", args, tmp_path / "serve.log", env={"LAZYLLM_API_KEY": key}) as base:
        keyless = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as caught:
            keyless.completions.create(model="tiny", prompt="Hi", max_tokens=2)
        assert caught.value.status_code == 401 and caught.value.code == "invalid_api_key"
        client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
        assert client.completions.create(model="tiny", prompt="Hi", max_tokens=2).choices[0].text is not None
        auth = {"Authorization": f"Bearer {key}"}
        status, body = _post(base, "/v1/completions", b'{"model": "tiny", "prompt": "Hi"}',
                             {**auth, "Content-Type": "text/plain", "Origin": "http://evil.example"})  # fmt: skip
        assert status == 415 and body["error"]["code"] == "unsupported_media_type"
        status, body = _post(base, "/v1/completions", b'{"model": "tiny", "prompt": "Hi"}',
                             {**auth, "Host": "evil.example:80"})  # fmt: skip
        assert status == 403 and body["error"]["code"] == "host_not_allowed"
        with urllib.request.urlopen(base + "/health", timeout=30) as resp:  # no key needed
            assert json.loads(resp.read())["status"] == "ok"
    assert key not in (tmp_path / "serve.log").read_text()

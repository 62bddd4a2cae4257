"""A tuned schedule as an MLflow model: MLflow's models-from-code ``pyfunc`` flavour.

The saved model bundles ``schedule.json`` (artifact ``schedule``) with a reference to the base model
(``model_config["base_model"]``: an alias such as ``smollm2-135m``, a folder or a hub id, loaded with
:func:`lazyllm.load_model` when MLflow loads the model). ``predict`` runs :meth:`LazyLLM.generate`, so

    mlflow.pyfunc.load_model("models:/NAME@champion").predict(["Question: ..."], params={"max_new_tokens": 8})

returns the same text as ``LazyLLM(model, schedule, tokenizer=tok).generate(prompt, max_new_tokens=8,
chat=True).text``, and ``mlflow models serve -m models:/NAME@champion --env-manager local`` answers
``POST /invocations`` with ``{"inputs": ["..."], "params": {"max_new_tokens": 8}}`` as
``{"predictions": [...]}``.

Input: prompts, one per row (a list of strings or a one-column DataFrame). Params:
``max_new_tokens`` (default 32), ``chat`` (default true: apply the tokenizer's chat template) and
``truncate`` (default false). A prompt that does not fit the base model's context with
``max_new_tokens`` more is refused with HTTP 400 naming the limit, before anything is generated,
unless the request sets ``truncate``: then it is cut in the middle (LongBench's rule, the engine's
own) and every prediction says what happened, ``{"text": ..., "prompt_tokens": N,
"truncated_to": M or null}``. Bad params are a 400 too (:func:`check_request`).
The model code is ``tuner/tracking/pyfunc_model.py``; loading needs this project installed (``--env-manager
local`` in its venv).

**OpenAI chat completions**, beside the string format: a request body with ``messages`` (MLflow's
server passes such a body to ``predict`` whole, as a dict) is answered as OpenAI's
``chat.completion``: ``choices[0].message``, ``finish_reason``, ``usage`` (prompt and completion
tokens) and a ``lazyllm`` object with the schedule's share of prompt (token, layer) pairs computed.
The body is checked, and the answer built, by :mod:`lazyllm.serving.protocol`, the same code as the
OpenAI-compatible server's (``python -m lazyllm.serve``; ``python -m tuner.serve --model-uri
models:/NAME@alias`` serves a registered version there): ``max_tokens`` (or ``max_completion_tokens``;
default: the ``max_new_tokens`` param, 32), ``temperature`` (OpenAI's default 1.0 samples; 0 is
greedy), ``top_p``, ``stop``, ``seed``, ``n`` (1 only), and the extensions ``top_k`` and
``repetition_penalty``, plus MLflow's param ``truncate``; ``model`` and ``user`` are ignored; any other
field is a 400 naming it (:func:`check_chat_request`). MLflow 3's scoring server answers every
request in one response (it has no streaming path), so ``"stream": true`` is a 400 that says so; in
Python, ``mlflow.pyfunc.load_model(uri).predict_stream(body)`` yields ``chat.completion.chunk`` dicts.
The input schema is left unset for this reason: with one, MLflow would cut a chat body down to its
``messages`` column before ``predict`` saw the other fields.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lazyllm.limits import context_length, prompt_limit
from lazyllm.schedule import Schedule
from lazyllm.serving import protocol
from lazyllm.serving.protocol import ChatRequest

MODEL_CODE = Path(__file__).resolve().with_name("pyfunc_model.py")
DEFAULT_MAX_NEW_TOKENS = 32


def signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    # no input schema: MLflow enforces one on a chat body too, and keeps only its `messages` column
    # (strings, one prompt per row, still arrive as an array; see the module docstring)
    return ModelSignature(
        inputs=None,
        outputs=Schema([ColSpec("string")]),
        params=ParamSchema(
            [
                ParamSpec("max_new_tokens", "long", DEFAULT_MAX_NEW_TOKENS),
                ParamSpec("chat", "boolean", True),
                ParamSpec("truncate", "boolean", False),
            ]
        ),
    )


def save_model(schedule: Schedule, path: Path, base_model: str | None = None) -> Path:
    """Write the MLflow model folder for ``schedule`` at ``path`` (which must not exist yet)."""
    import tempfile
    import warnings

    import mlflow

    import lazyllm

    # the signature is explicit (predict's DataFrame hint keeps MLflow from inferring one) and there is
    # no input example: MLflow would load the base model to check it
    with tempfile.TemporaryDirectory(prefix="lazyllm-model-") as tmp, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*input example was not provided")
        file = schedule.save(Path(tmp) / "schedule.json")
        mlflow.pyfunc.save_model(
            str(path),
            python_model=str(MODEL_CODE),
            artifacts={"schedule": str(file)},
            model_config={"base_model": base_model or schedule.model},
            signature=signature(),
            # explicit, so MLflow does not load the model in a subprocess to infer them
            pip_requirements=[f"lazyllm-tuner=={lazyllm.__version__}", "torch", "transformers", "mlflow"],
        )
    return path


def _prompts(model_input: Any) -> list[str]:
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "columns"):  # a pandas DataFrame
        column = "prompt" if "prompt" in model_input.columns else model_input.columns[0]
        return [str(v) for v in model_input[column].tolist()]
    if isinstance(model_input, dict):
        values = model_input.get("prompt")
        if values is None:
            raise ValueError(f"input has no 'prompt' field (got {sorted(model_input)})")
        return [values] if isinstance(values, str) else [str(v) for v in values]
    return [str(v) for v in model_input]


@dataclass(frozen=True)
class Request:
    """The params of one prediction request, checked (see the module docstring)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    chat: bool = True
    truncate: bool = False


def _bad_request(message: str) -> Exception:
    """An error MLflow's scoring server answers with HTTP 400 (a plain one would be a 500)."""
    from mlflow.exceptions import MlflowException

    return MlflowException.invalid_parameter_value(message)


def check_request(params: dict[str, Any] | None) -> Request:
    """``params`` as a :class:`Request`; unknown names or bad values are a 400 naming the param."""
    params = {k: v for k, v in (params or {}).items() if v is not None}  # None: the default
    unknown = sorted(set(params) - {"max_new_tokens", "chat", "truncate"})
    if unknown:
        raise _bad_request(f"unknown params {unknown}; valid: max_new_tokens, chat, truncate")
    max_new = params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 1:
        raise _bad_request(f"params.max_new_tokens = {max_new!r}: must be an integer >= 1")
    flags = {}
    for name, default in (("chat", True), ("truncate", False)):
        value = params.get(name, default)
        if not isinstance(value, bool):
            raise _bad_request(f"params.{name} = {value!r}: must be true or false")
        flags[name] = value
    return Request(max_new, **flags)


def check_chat_request(
    body: dict[str, Any], params: dict[str, Any] | None = None, *, streaming: bool = False
) -> tuple[ChatRequest, bool]:
    """An OpenAI chat body, checked by :func:`lazyllm.serving.protocol.check_chat_request` (MLflow's params:
    ``max_new_tokens`` as the default length, ``truncate``), and whether to truncate; anything wrong
    is a 400 naming the field. ``"stream": true`` is refused unless ``streaming`` (``predict_stream``)."""
    request = check_request(params)
    try:
        chat = protocol.check_chat_request(body, default_max_tokens=request.max_new_tokens)
    except protocol.APIError as exc:
        raise _bad_request(str(exc)) from None
    if chat.decoding.stream and not streaming:
        raise _bad_request(
            "stream = true: `mlflow models serve` answers every request in one response (MLflow's scoring "
            "server has no streaming); leave stream out, call predict_stream on the loaded model, or "
            "serve with python -m tuner.serve for OpenAI streaming"
        )
    return chat, request.truncate


class ScheduleModel:
    """The pyfunc model: a base model loaded once, with the tuned schedule applied per call."""

    def __init__(self) -> None:
        self.llm: Any = None

    def load_context(self, context: Any) -> None:
        from lazyllm.engine import LazyLLM
        from lazyllm.models import load_model

        schedule = Schedule.load(context.artifacts["schedule"])  # checked before the weights load
        base = str((context.model_config or {}).get("base_model") or schedule.model)
        model, tokenizer = load_model(base)
        self.llm = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)

    def prompt_limit(self, max_new_tokens: int) -> int | None:
        """Most prompt tokens that fit the base model's context with ``max_new_tokens`` more (None: no
        limit; :func:`lazyllm.limits.prompt_limit`, a 400 when there is no room for a prompt)."""
        context = context_length(self.llm.model)
        if context is None:
            return None
        try:
            return prompt_limit(context, max_new_tokens, name="max_new_tokens").tokens
        except ValueError as exc:
            raise _bad_request(str(exc)) from None

    def check_lengths(self, lengths: list[int], max_new_tokens: int, truncate: bool) -> None:
        """A 400 for a prompt that does not fit the context with ``max_new_tokens`` more, unless ``truncate``."""
        limit = self.prompt_limit(max_new_tokens)
        if limit is None:
            return
        over = [(i, n) for i, n in enumerate(lengths) if n > limit]
        if over and not truncate:
            i, n = over[0]
            raise _bad_request(
                f"prompt {i} has {n} tokens; the limit is {limit} prompt tokens (the model's "
                f"{limit + max_new_tokens}-token context minus max_new_tokens {max_new_tokens}); "
                'shorten it, or pass params {"truncate": true} to cut it in the middle'
            )

    def _chat_prompt(self, chat: ChatRequest, truncate: bool) -> int:
        """The prompt length of a chat request, checked against the context."""
        from lazyllm.text import encode_prompt

        if not getattr(self.llm.tokenizer, "chat_template", None):
            raise _bad_request("messages need a chat template, and the base model's tokenizer has none")
        n = int(encode_prompt(self.llm.tokenizer, list(chat.messages)).shape[1])
        self.check_lengths([n], chat.decoding.max_tokens, truncate)
        return n

    def _generate(self, chat: ChatRequest, stream: bool) -> Any:
        decoding = chat.decoding
        call = self.llm.stream if stream else self.llm.generate
        return call(
            list(chat.messages), max_new_tokens=decoding.max_tokens, stop_strings=decoding.stop,
            generation_config=decoding.sampling,
        )  # fmt: skip

    def chat_completion(self, chat: ChatRequest, truncate: bool = False) -> dict[str, Any]:
        """OpenAI's ``chat.completion`` object for one checked request."""
        n = self._chat_prompt(chat, truncate)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*cut in the middle")  # said in the answer instead
            result = self._generate(chat, stream=False)
        head = protocol.ResponseHead.new("chatcmpl", self.llm.schedule.model)
        return protocol.chat_completion(head, result, result.text, _extension(result, n))

    def predict_stream(
        self, context: Any, model_input: dict[str, Any], params: dict[str, Any] | None = None
    ) -> Iterator[dict[str, Any]]:
        """OpenAI ``chat.completion.chunk`` dicts for a chat body (``stream`` may be true here): the
        first carries the role, each a piece of text, the last the finish reason, usage and ``lazyllm``."""
        if not (isinstance(model_input, dict) and "messages" in model_input):
            raise _bad_request('predict_stream takes an OpenAI chat body: {"messages": [...], ...}')
        chat, truncate = check_chat_request(model_input, params, streaming=True)
        n = self._chat_prompt(chat, truncate)
        chunks = protocol.Chunks(protocol.ResponseHead.new("chatcmpl", self.llm.schedule.model), chat=True)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*cut in the middle")
            stream = self._generate(chat, stream=True)
            for i, piece in enumerate(stream):
                yield chunks.piece(piece, first=i == 0)
        result = stream.result
        last = chunks.finish(result.finish_reason)
        yield {**last, "usage": protocol.usage(result), "lazyllm": _extension(result, n)}

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> Any:
        """One generated text per prompt (MLflow passes an array or a DataFrame; lists work too); with
        ``truncate``, one ``{"text", "prompt_tokens", "truncated_to"}`` record per prompt. A chat body
        (a dict with ``messages``) gets one OpenAI ``chat.completion`` (see the module docstring)."""
        from lazyllm.text import encode_prompt

        if isinstance(model_input, dict) and "messages" in model_input:
            return self.chat_completion(*check_chat_request(model_input, params))
        request = check_request(params)
        prompts = _prompts(model_input)
        chat = request.chat
        if chat and not getattr(self.llm.tokenizer, "chat_template", None):
            raise _bad_request(
                "params.chat = true but the base model's tokenizer has no chat template; pass false"
            )
        lengths = [int(encode_prompt(self.llm.tokenizer, p, chat=chat).shape[1]) for p in prompts]
        self.check_lengths(lengths, request.max_new_tokens, request.truncate)
        records = []
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*cut in the middle")  # said in the record instead
            for prompt, n in zip(prompts, lengths, strict=True):
                result = self.llm.generate(prompt, max_new_tokens=request.max_new_tokens, chat=chat)
                cut = result.prompt_tokens if result.prompt_tokens < n else None
                records.append({"text": result.text, "prompt_tokens": n, "truncated_to": cut})
        if request.truncate:
            return records
        return [r["text"] for r in records]


def _extension(result: Any, n: int) -> dict[str, Any]:
    """The ``lazyllm`` object, with ``truncated_from`` (the prompt's length before a cut, else None)."""
    return protocol.lazyllm_fields(result, truncated_from=n if result.prompt_tokens < n else None)


def python_model() -> Any:
    """:class:`ScheduleModel` as an ``mlflow.pyfunc.PythonModel`` (MLflow imported only here)."""
    from mlflow.pyfunc import PythonModel

    class _Model(ScheduleModel, PythonModel):
        pass

    return _Model()

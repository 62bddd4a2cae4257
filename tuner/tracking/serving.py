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
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lazyllm.schedule import Schedule

MODEL_CODE = Path(__file__).resolve().with_name("pyfunc_model.py")
DEFAULT_MAX_NEW_TOKENS = 32


def signature() -> Any:
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    return ModelSignature(
        inputs=Schema([ColSpec("string")]),  # one prompt per row
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
        """Most prompt tokens that fit the base model's context with ``max_new_tokens`` more (None: no limit)."""
        context = getattr(self.llm.model.config, "max_position_embeddings", None)
        return None if not context else int(context) - max_new_tokens

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> list[Any]:
        """One generated text per prompt (MLflow passes a one-column DataFrame; lists work too); with
        ``truncate``, one ``{"text", "prompt_tokens", "truncated_to"}`` record per prompt."""
        from lazyllm.text import encode_prompt

        request = check_request(params)
        prompts = _prompts(model_input)
        limit = self.prompt_limit(request.max_new_tokens)
        chat = request.chat
        if chat and not getattr(self.llm.tokenizer, "chat_template", None):
            raise _bad_request(
                "params.chat = true but the base model's tokenizer has no chat template; pass false"
            )
        lengths = [int(encode_prompt(self.llm.tokenizer, p, chat=chat).shape[1]) for p in prompts]
        if limit is not None and limit < 2:
            raise _bad_request(f"params.max_new_tokens = {request.max_new_tokens} leaves no room for a prompt "
                               f"in the model's {limit + request.max_new_tokens}-token context")  # fmt: skip
        over = [(i, n) for i, n in enumerate(lengths) if limit is not None and n > limit]
        if over and not request.truncate:
            i, n = over[0]
            raise _bad_request(
                f"prompt {i} has {n} tokens; the limit is {limit} prompt tokens (the model's "
                f"{limit + request.max_new_tokens}-token context minus max_new_tokens {request.max_new_tokens}); "  # type: ignore[operator]
                'shorten it, or pass params {"truncate": true} to cut it in the middle'
            )
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


def python_model() -> Any:
    """:class:`ScheduleModel` as an ``mlflow.pyfunc.PythonModel`` (MLflow imported only here)."""
    from mlflow.pyfunc import PythonModel

    class _Model(ScheduleModel, PythonModel):
        pass

    return _Model()

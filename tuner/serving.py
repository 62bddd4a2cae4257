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
``max_new_tokens`` (default 32) and ``chat`` (default true: apply the tokenizer's chat template).
The model code is ``tuner/pyfunc_model.py``; loading needs this project installed (``--env-manager
local`` in its venv).
"""

from __future__ import annotations

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
            [ParamSpec("max_new_tokens", "long", DEFAULT_MAX_NEW_TOKENS), ParamSpec("chat", "boolean", True)]
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


class ScheduleModel:
    """The pyfunc model: a base model loaded once, with the tuned schedule applied per call."""

    def __init__(self) -> None:
        self.llm: Any = None

    def load_context(self, context: Any) -> None:
        from lazyllm.engine import LazyLLM
        from lazyllm.models import load_model

        schedule = Schedule.load(context.artifacts["schedule"])
        base = str((context.model_config or {}).get("base_model") or schedule.model)
        model, tokenizer = load_model(base)
        self.llm = LazyLLM(model, schedule, tokenizer=tokenizer, strict_model_name=False)

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> list[str]:
        """One generated text per prompt (MLflow passes a one-column DataFrame; lists work too)."""
        params = params or {}
        max_new = int(params.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
        chat = bool(params.get("chat", True))
        return [self.llm.generate(p, max_new_tokens=max_new, chat=chat).text for p in _prompts(model_input)]


def python_model() -> Any:
    """:class:`ScheduleModel` as an ``mlflow.pyfunc.PythonModel`` (MLflow imported only here)."""
    from mlflow.pyfunc import PythonModel

    class _Model(ScheduleModel, PythonModel):
        pass

    return _Model()

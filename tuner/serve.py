"""Serve a schedule from the MLflow registry to OpenAI clients: MLflow stays the registry,
``python -m lazyllm.serve`` is the server.

    python -m tuner.serve --model-uri models:/NAME@champion [--tracking-uri URI] \\
        [--base-model M] [--host 127.0.0.1] [--port 8000] [--max-batch 8] [...]

Downloads the registered model version (or any MLflow model URI: ``models:/NAME/3``, ``runs:/...``,
a saved model folder), reads its ``schedule.json`` and base-model reference (the ``base_model`` the
pyfunc model was saved with, :func:`tuner.tracking.serving.save_model`), and starts
:func:`lazyllm.serve.create_app` on them: ``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``, as ``python -m lazyllm.serve`` documents. The served model name is the
registered model's name (``--served-model-name`` overrides); the schedule is named ``tuned`` and
``unpruned`` is offered beside it. ``--base-model`` replaces the saved reference (a checkpoint folder
that lives elsewhere on this machine). The server flags are ``lazyllm.serve``'s.

The same version still serves MLflow's pyfunc format with ``mlflow models serve``
(``/invocations``); docs/serving.md says which to use when.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from lazyllm.cli import cli_main
from lazyllm.serve import DEFAULT_SCHEDULE_NAME, add_arguments, run, settings_from_args
from tuner.redact import redact_text


@dataclass(frozen=True)
class RegisteredSchedule:
    """What a saved schedule model holds: its schedule file and the base model it names."""

    schedule: Path
    base_model: str


def read_model_folder(folder: Path) -> RegisteredSchedule:
    """The schedule and base model of a model folder written by :func:`tuner.tracking.serving.save_model`."""
    from mlflow.models import Model

    if not (folder / "MLmodel").is_file():
        raise ValueError(
            f"{folder} has no MLmodel file: give an MLflow model saved by python -m tuner.export"
        )
    flavor = Model.load(str(folder)).flavors.get("python_function") or {}
    schedule = (flavor.get("artifacts") or {}).get("schedule", {}).get("path")
    base = (flavor.get("config") or {}).get("base_model")
    if not schedule or not (folder / schedule).is_file() or not base:
        raise ValueError(
            f"{folder} is not a LazyLLM schedule model (no schedule artifact or base_model); "
            "register one with python -m tuner.export --register NAME"
        )
    return RegisteredSchedule(folder / schedule, str(base))


def download_model(uri: str, tracking_uri: str | None, dst: Path) -> Path:
    """The local folder of MLflow model ``uri`` (downloaded into ``dst`` unless it is a local folder)."""
    import mlflow

    if Path(uri).is_dir():
        return Path(uri)
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)  # models:/ URIs are resolved in the registry
    try:
        return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst)))
    except Exception as exc:  # MLflow raises several types for a missing model, version or alias
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(
            f"cannot download {uri} from MLflow: {first}; check --model-uri and --tracking-uri"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tuner.serve", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument(
        "--model-uri", required=True, help="models:/NAME@alias, models:/NAME/<version>, runs:/..., a folder"
    )
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking and registry URI (default: $MLFLOW_TRACKING_URI)"
    )
    parser.add_argument("--base-model", help="base model instead of the one the model was saved with")
    add_arguments(parser, schedules=False)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from tuner.export import existing_tracking_uri

    tracking = None if Path(args.model_uri).is_dir() else existing_tracking_uri(args.tracking_uri)
    with tempfile.TemporaryDirectory(prefix="lazyllm-serve-") as tmp:
        saved = read_model_folder(download_model(args.model_uri, tracking, Path(tmp)))
        name = args.served_model_name
        if name is None and args.model_uri.startswith("models:/"):
            name = args.model_uri[len("models:/") :].split("@")[0].split("/")[0]
        settings = settings_from_args(
            args,
            model=args.base_model or saved.base_model,
            schedules=((DEFAULT_SCHEDULE_NAME, saved.schedule),),
            served_model_name=name,
        )
        return run(settings)


def main(argv: list[str] | None = None) -> int:
    return cli_main(_parser(), _serve, argv, redact=redact_text)


if __name__ == "__main__":
    sys.exit(main())

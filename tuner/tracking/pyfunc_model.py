"""MLflow models-from-code entry point for a tuned schedule (see :mod:`tuner.tracking.serving`).

MLflow copies this file into every saved schedule model and runs it when the model is loaded; nothing
in the package imports it.
"""

import mlflow.models

from tuner.tracking.serving import python_model

mlflow.models.set_model(python_model())

"""The OpenAI-compatible server of a tuned schedule, one module per job:

* :mod:`lazyllm.serving.settings`: what one server serves and how (:class:`ServeSettings`, the flags);
* :mod:`lazyllm.serving.protocol`: OpenAI's request bodies (pydantic models), their checks into typed
  records, the error object and the answers' shapes;
* :mod:`lazyllm.serving.queue`: the request queue and the engine worker that decodes the requests
  as one batch;
* :mod:`lazyllm.serving.app`: the FastAPI app (``create_app``) and its route handlers.

``python -m lazyllm.serve`` (:mod:`lazyllm.serve`) is the command line on top. Nothing here imports
Optuna or MLflow.
"""

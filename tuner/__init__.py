"""Auto-tuner for LazyLLM schedules: Optuna search, LongBench evaluation and MLflow tracking."""

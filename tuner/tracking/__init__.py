"""MLflow: one parent run per study and a child per trial, the Model Registry, a schedule as an MLflow model."""

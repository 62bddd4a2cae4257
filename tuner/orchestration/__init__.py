"""The code that runs a study: checks before anything is written (preflight), then the session
that runs the stages, the report and tracking in order. It sits above everything it orchestrates."""

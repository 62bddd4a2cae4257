"""LongBench and the open-QA tasks as records, where they come from, and their metrics."""

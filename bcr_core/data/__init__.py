"""Data: evaluation sets (committed files rebuilt from pinned wheels), the benchmark registry,
answer grading, role prompts and the synthetic task."""

"""lm-eval task definitions for `make eval` (YAML), their data (jsonl) and loader (task_data.py)."""

"""`make eval`: lm-evaluation-harness as a real client of a pdbus cluster (docs/EVAL.md).

Modules: `make_task_data` (writes the tasks' jsonl), `tasks/` (the lm-eval task YAMLs and their
loader), `pdbus_offline` (the lm-eval model `pdbus-offline`: the engine in-process), `eval_stats`
(paired differences, intervals, the table), `eval_servers` (start and stop a pdbus cluster or vLLM's
server), `eval_runner` (`python -m harness.eval`: every run, the table, results/eval-*.json).
Everything but `make_task_data` and `eval_stats` needs lm-eval (`make install-eval`: .venv-eval).
"""

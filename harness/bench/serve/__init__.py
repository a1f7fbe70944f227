"""The serving benchmark (`make bench`, `pdbus bench`): pdbus disaggregated vs colocated vs vLLM,
driven side by side over the OpenAI streaming API, with `vllm bench serve`'s metrics and
DistServe's SLO attainment. Modules: `serve_workload` (requests, arrivals), `load_generator`,
`serve_metrics` (definitions, goodput, attainment), `systems` (start/stop each system),
`serve_runner` (the sweep), `serve_report` (table, targets), `plots` (PNGs), `serve_cli` (flags and
presets).
"""

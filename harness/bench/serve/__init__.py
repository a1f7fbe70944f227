"""The serving benchmark (`make bench`, `pdbus bench`): pdbus disaggregated vs colocated vs vLLM,
driven side by side over the OpenAI streaming API, with `vllm bench serve`'s metrics and
DistServe's SLO attainment. Modules: `workload` (requests, arrivals), `client` (the load
generator), `metrics` (definitions, goodput, attainment), `systems` (start/stop each system),
`runner` (the sweep), `report` (table, targets), `plots` (PNGs), `cli` (flags and presets).
"""

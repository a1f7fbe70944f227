"""The OpenAI-compatible gateway: HTTP (+SSE) and WebSocket in front of the cluster (docs/API.md).

Layout: `config` ([gateway] settings), `errors` (OpenAI's error shape), `schema` (request
validation, pure), `protect` (API keys and per-key rate limits, pure with `now`), `openai_format`
(response objects and chunks, pure), `relay` (a bounded per-stream buffer with a stall cut-off),
`backend` (tokenizer + `ClusterClient` + readiness probe), `metrics` (prometheus-client),
`serve` (one request whatever the transport: admission, relay, metrics, access log), `http` and
`websocket` (aiohttp handlers), `app` (middlewares, wiring, `run_gateway`); `workers` (the parent of
`--workers N`: holds the port, starts and restarts the workers) and `shared_limits` (the
workers' per-key limits in one shared-memory table).
The gateway is a bus client (role `gateway`); `ClusterClient` owns orchestration and failover.
"""

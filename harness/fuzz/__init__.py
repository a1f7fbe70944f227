"""Hostile-traffic fuzzing of a live local cluster (`make fuzz`, `python -m harness.fuzz`): can any
message or HTTP field take a process down or make it leak?

Modules: `strategies` (hypothesis strategies for every message kind of docs/PROTOCOL.md parts 1 and 2
and the gateway's HTTP/WebSocket requests), `forged_frames` (the frames a peer can build: checksummed KV
headers over any fields, forged transfers), `sampler` (hypothesis's own generation driven in rounds),
`bus_peer` (unregistered and registered control-plane peers), `hostile_node` (a registered node that
answers what it is routed with forged replies and forged-but-checksummed KV), `kv_peer` (the KV data
plane), `http_peer` (the gateway), `loop` (the time-bounded fuzz loop), `fuzz_runner` (cluster, checks,
verdict) and `fuzz_report` (RSS, logged errors, the summary).
"""

"""The client side of a cluster request (docs/CLUSTER.md): plan -> prefill -> KV -> decode, with
failover; what the gateway, `pdbus complete` and the harness drive. No torch: it imports only the
bus and the wire bodies (nodes/wire/, which the node processes read and write too).

- client.py      `ClusterClient`: the bus peer; `generate(...)` -> `Generation` (the whole contract)
- generation.py  `Generation`: one request's stream across its attempts; the retry budget
- attempt.py     `Attempt`: one decode request and the prefill(s) feeding it; `AttemptOwner` (all an
                 attempt sees of its generation) and `AttemptSpec` (what it asks for)
- retries.py     `Retry`: why an attempt ended, how long to wait before the next
- results.py     `StreamToken`, `GenerationResult`, `RequestTrace`, `ClusterError`
"""

from nodes.cluster.client import ClusterClient
from nodes.cluster.generation import Generation
from nodes.cluster.results import ClusterError, GenerationResult, RequestTrace, StreamToken

__all__ = ["ClusterClient", "ClusterError", "Generation", "GenerationResult", "RequestTrace", "StreamToken"]

"""An engine-less token load generator: decode nodes that register with the real broker and
stream tokens at a configured step rate, so the token plane (broker, endpoints, gateway) can be
loaded far past what real engines on this machine could produce.

- core.py      `LoadGenCore`: one node's admission, steps, tokens and FINALs, sans I/O
- node.py      `LoadGenNode` (a real bus Endpoint around a core) and the `Driver` thread
- __main__.py  `python -m harness.loadgen`: one process of N nodes (the bench starts several)
"""

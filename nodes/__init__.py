"""pdbus nodes: processes that wire engines and the gateway to the bus, and the `pdbus` CLI.

Only `nodes.engines` imports torch (or vllm); everything else here is wiring.
"""

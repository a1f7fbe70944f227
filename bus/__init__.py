"""pdbus message bus: broker, node endpoints, heartbeats and the KV data plane.

Contract: nothing in this package knows about models or imports torch; it moves frames
between peers and tells its callers who is alive.
"""

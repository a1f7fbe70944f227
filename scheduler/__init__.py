"""pdbus scheduler: plain data structures for routing (no zmq, no torch)."""

"""Chaos and failover scenarios (a later issue)."""

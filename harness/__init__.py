"""Harnesses that prove pdbus's claims: benchmarks (`harness.bench`) and chaos (`harness.chaos`)."""

"""The lending rule: when a decode node prefills a prompt itself rather than let it queue at a busy
prefill node (docs/CLUSTER.md, the `local` plan). Plain data: no torch, no I/O.

Contract: `LendSettings.from_section([decode])` reads and validates the `lend_*` keys;
`LendSettings.lends(...)` is the decision for one request, from numbers the decode node has at
hand: `may_lend` (the first three below, cheap) and `sooner_here` (the last, which needs the
node's own queue counted). It lends when every one holds:
  - lending is on (`prefill_tokens` > 0) and the prompt has 1..`prefill_tokens` tokens;
  - the client has at least `min_backlog_tokens` prompt tokens waiting at prefill nodes;
  - the node holds fewer than `max_running` requests (a bound on what lending costs its streams);
  - it would finish the prompt sooner: `margin` x (its own unprefilled prompt tokens + the prompt)
    < (the client's backlog + the prompt). Both sides count tokens ahead of the prompt's last one
    on one core each; `margin` prices what this core does besides (one decode token per stream in
    every chunk's forward pass) and keeps a near tie at the prefill node. 0 leaves the comparison
    out: lend whenever the other conditions hold.
"""

from __future__ import annotations

from dataclasses import dataclass

from nodes.config_file import SettingsError, whole_number

_WHOLE_NUMBERS = ("prefill_tokens", "max_running", "min_backlog_tokens")


@dataclass(frozen=True)
class LendSettings:
    """`[decode] lend_*`: 0 `prefill_tokens` turns lending off."""

    prefill_tokens: int = 0        # prompts up to this many tokens
    max_running: int = 1           # while it holds fewer requests than this
    min_backlog_tokens: int = 1    # and the client has at least this many prompt tokens waiting at prefill nodes
    margin: float = 1.4            # and margin x (own queue + prompt) < backlog + prompt; 0: no comparison

    @classmethod
    def from_section(cls, decode: dict) -> LendSettings:
        values = {name: whole_number(decode.get(f"lend_{name}", getattr(cls, name)), f"[decode] lend_{name}")
                  for name in _WHOLE_NUMBERS}
        margin = decode.get("lend_margin", cls.margin)
        if isinstance(margin, bool) or not isinstance(margin, int | float) or not 0 <= margin <= 100:
            raise SettingsError(f"[decode] lend_margin must be a number in [0, 100], got {margin!r}")
        return cls(**values, margin=float(margin))

    def lends(self, *, num_prompt_tokens: int, backlog_tokens: int, own_queue_tokens: int,
              num_requests: int) -> bool:
        """Whether a decode node prefills this prompt itself: `backlog_tokens` are the client's
        prompt tokens waiting at prefill nodes (the prompt not among them), `own_queue_tokens`
        the prompt tokens this node has yet to prefill, `num_requests` the requests it holds."""
        return (self.may_lend(num_prompt_tokens=num_prompt_tokens, backlog_tokens=backlog_tokens,
                              num_requests=num_requests)
                and self.sooner_here(num_prompt_tokens, backlog_tokens, own_queue_tokens))

    def may_lend(self, *, num_prompt_tokens: int, backlog_tokens: int, num_requests: int) -> bool:
        """The guards alone (on, the prompt's size, a backlog, the bound): what a node checks
        before it counts its own queue."""
        return (0 < num_prompt_tokens <= self.prefill_tokens and backlog_tokens >= self.min_backlog_tokens
                and num_requests < self.max_running)

    def sooner_here(self, num_prompt_tokens: int, backlog_tokens: int, own_queue_tokens: int) -> bool:
        """The comparison alone: this node would finish the prompt sooner than the prefill nodes."""
        return self.margin * (own_queue_tokens + num_prompt_tokens) < backlog_tokens + num_prompt_tokens

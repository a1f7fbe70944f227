"""How long a retry waits (nodes/cluster/retries.py): at once after a node loss, a little after
`no_node`, the node's own hint when it gives one, else the client's retry delay."""

from __future__ import annotations

import pytest

from bus.mailbox import BusError
from nodes.cluster.retries import Retry, retry_delay, retry_from


@pytest.mark.parametrize(("code", "details", "expected_s"), [
    ("node_lost", {"node_id": "decode-1"}, 0.0),      # the broker already dropped the node: at once
    ("request_lost", {}, 0.0),
    ("no_node", {}, 0.5),                              # maybe mid re-registration: wait a little
    ("kv_failed", {}, 0.2),                            # anything else: the client's retry delay
    ("full", {"retry_after_s": 1.5}, 1.5),             # the node said when
])
def test_a_retry_after_a_node_loss_goes_out_at_once_others_wait(code, details, expected_s):
    retry = retry_from(BusError("r1", code, "why", details))
    assert retry_delay(retry, default_s=0.2) == expected_s
    assert retry_delay(Retry("stalled"), default_s=0.2) == 0.2

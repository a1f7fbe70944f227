"""Ask the cluster's brokers for their stats (`pdbus.broker.stats`), for `pdbus ray status` (no Ray).

Contract: `broker_stats(settings, endpoints, timeout_s=5.0) -> dict | None`: the stats body of
one broker (every broker knows the whole registry: nodes by role, `role_by_node`, each serving
node's last capacity report), asked as a short-lived bus client with the config's heartbeat and
CURVE settings (key pair `gateway`); None when no broker answers within `timeout_s` or the
settings do not let us in.
"""

from __future__ import annotations

from bus.bus_client import BusClient
from bus.constants import BROKER_STATS_SERVICE
from bus.liveness import HeartbeatConfig
from bus.mailbox import BusError
from bus.messages import Final
from bus.security import SecurityError
from nodes.bus_config import security_config
from nodes.config_file import section


def broker_stats(settings: dict, endpoints: list[str], timeout_s: float = 5.0) -> dict | None:
    endpoint = ",".join(endpoints)
    try:
        client = BusClient(endpoint, heartbeat=HeartbeatConfig.from_settings(section(settings, "heartbeat")),
                           security=security_config(settings, "gateway", endpoint))
        client.start(timeout_s)
    except (TimeoutError, SecurityError, OSError):
        return None
    try:
        replies = client.call_blocking(BROKER_STATS_SERVICE, {}, timeout=timeout_s)
    except (BusError, TimeoutError):
        return None
    finally:
        client.close()
    final = replies[-1] if replies else None
    return final.body if isinstance(final, Final) and isinstance(final.body, dict) else None


"""`pdbus ray status`'s report and table from gathered answers (pure)."""

from __future__ import annotations

from nodes.ray_pools.status_table import component_row, render, status_report

STATS = {"nodes_by_role": {"prefill": 1, "decode": 1}, "num_routes": 3, "queued_by_service": {"decode": 0},
         "capacity_by_node": {"decode-0": {"num_running": 2, "max_running": 16, "kv_blocks_free": 400,
                                           "kv_blocks_total": 512}, "prefill-0": {"queued_tokens": 96}},
         "role_by_node": {"decode-0": "decode", "prefill-0": "decode"}}


def _info(name: str, kind: str, **fields) -> dict:
    return {"name": name, "kind": kind, "role": kind, "state": "ready", "ready": True, "restarts": 0,
            "last_exit": None, "pid": 100, "actor_pid": 90, "ray_node": "abcdef0123456789", "ip": "127.0.0.1",
            **fields}


def _rows(stats):
    facts = {"ray_state": "ALIVE", "ray_restarts": 0, "ray_node": "abcdef0123456789"}
    return [component_row("decode-0", _info("decode-0", "decode", restarts=2), facts, stats),
            component_row("prefill-0", _info("prefill-0", "prefill"), {**facts, "ray_restarts": 1}, stats),
            component_row("broker", _info("broker", "broker"), facts, stats),
            component_row("decode-1", None, {"ray_state": "RESTARTING", "ray_restarts": 1, "ray_node": None}, stats)]


def test_rows_take_roles_and_load_from_the_broker_and_state_from_the_actor_or_ray():
    decode, prefill, broker, lost = _rows(STATS)
    assert decode["load"] == {"num_running": 2, "max_running": 16, "kv_blocks_free": 400, "kv_blocks_total": 512}
    assert decode["restarts"] == {"actor": 0, "process": 2}
    assert prefill["role"] == "decode"   # it switched: the broker knows, the plan does not
    assert broker["load"] == {"routes": 3, "queued": {"decode": 0}}
    assert (lost["kind"], lost["state"], lost["ready"], lost["pid"]) == ("decode", "restarting", False, None)


def test_the_report_counts_pools_in_order_and_the_table_shows_each_component():
    report = status_report(_rows(STATS), {"abcdef0123456789": "127.0.0.1", "n2": "127.0.0.1"}, STATS)
    assert list(report["pools"]) == ["broker", "prefill", "decode"]
    assert report["pools"]["decode"] == {"components": 2, "ready": 1}
    assert [row["name"] for row in report["components"]] == ["broker", "prefill-0", "decode-0", "decode-1"]
    text = render(report)
    assert text.splitlines()[0] == "pools: broker 1/1 ready, prefill 1/1 ready, decode 1/2 ready; 2 Ray nodes"
    assert text.splitlines()[1].split() == ["NAME", "POOL", "ROLE", "STATE", "RAY", "NODE", "PID", "RESTARTS", "LOAD"]
    assert "running 2/16, kv free 400/512" in text and "queued 96 tok" in text and "abcdef01 127.0.0.1" in text


def test_without_broker_stats_or_components_it_says_so():
    report = status_report(_rows(None), {}, None)
    assert report["components"][1]["role"] == "prefill" and report["components"][1]["load"] == {}
    assert render(report).endswith("(no broker answered: roles are the actors', load unknown)")
    assert render(status_report([], {}, None)).startswith("no pdbus components")

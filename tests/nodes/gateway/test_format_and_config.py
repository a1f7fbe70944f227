"""Response shapes (nodes/gateway/openai_format.py) and the [gateway] settings (gateway_settings.py)."""

import pytest

from nodes.cluster import RequestTrace
from nodes.config_file import SettingsError
from nodes.gateway.gateway_settings import GatewayConfig, kv_mode_name
from nodes.gateway.openai_format import Shaper, pdbus_headers, pdbus_info


def trace():
    t = RequestTrace("r1", "s1", decode_node_ids=["decode-0", "decode-1"], prefill_node_ids=["prefill-0"],
                     plans=["remote", "remote"], num_failovers=1)
    t.timings["ttft_s"] = 0.01
    return t


def test_pdbus_info_and_headers_name_the_nodes_mode_and_failover():
    info = pdbus_info(trace(), "int8+auto")
    assert (info["prefill_node"], info["decode_node"], info["kv_mode"], info["failover"]) == \
        ("prefill-0", "decode-1", "int8+auto", True)
    headers = pdbus_headers(info)
    assert headers["X-Pdbus-Prefill-Node"] == "prefill-0" and headers["X-Pdbus-Decode-Node"] == "decode-1"
    assert headers["X-Pdbus-KV-Mode"] == "int8+auto" and headers["X-Pdbus-Failover"] == "true"


def test_kv_mode_is_the_transfers_own_once_the_kv_moved():
    t = trace()
    t.kv_transfers.append({"mode": "int8", "compression": "none", "seconds": 0.01, "checksum_failures": 2,
                           "resends": 2})
    assert pdbus_info(t, "int8+auto")["kv_mode"] == "int8"   # auto chose to store it: say what travelled


def test_metrics_count_kv_transfer_time_checksum_failures_and_resends():
    from nodes.gateway.gateway_metrics import GatewayMetrics

    t = trace()
    t.kv_transfers.append({"mode": "int8", "compression": "none", "seconds": 0.01, "checksum_failures": 2,
                           "resends": 3})
    metrics = GatewayMetrics()
    metrics.observe_stream(t, {"prompt_tokens": 4, "completion_tokens": 2}, [1.0, 1.1], 0.9, 1.2)
    text = metrics.render()[0].decode()
    assert "pdbus_kv_checksum_failures_total 2.0" in text and "pdbus_kv_resends_total 3.0" in text
    assert "pdbus_kv_transfer_seconds_count 1.0" in text


def test_a_cached_plan_moved_no_kv():
    t = RequestTrace("r", "s", decode_node_ids=["decode-0"], plans=["cached"])
    info = pdbus_info(t, "raw")
    assert info["kv_mode"] == "none" and pdbus_headers(info)["X-Pdbus-Prefill-Node"] == "decode-0 (local)"


def test_chat_and_completion_shapes():
    chat, completion = Shaper(True, "m", "id", 1), Shaper(False, "m", "id", 1)
    assert chat.first_chunk()["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert completion.first_chunk() is None
    assert chat.chunk("a")["choices"][0]["delta"] == {"content": "a"}
    assert completion.chunk("a")["choices"][0]["text"] == "a"
    final = chat.final_chunk("stop", {"x": 1})
    assert final["choices"][0]["finish_reason"] == "stop" and final["pdbus"] == {"x": 1}
    assert chat.usage_chunk({"prompt_tokens": 2, "completion_tokens": 3})["usage"]["total_tokens"] == 5
    response = chat.response("hi", "length", {"prompt_tokens": 1, "completion_tokens": 1}, {})
    assert response["object"] == "chat.completion" and response["choices"][0]["message"]["content"] == "hi"


def test_config_reads_gateway_keys_and_refuses_typos():
    settings = {"gateway": {"port": 9000, "api_keys": "a,b", "rate_limit_rps": 5}, "kv": {"quant": "raw",
                                                                                           "compression": "none"}}
    config = GatewayConfig.from_settings(settings, host="0.0.0.0")
    assert (config.host, config.port, config.api_keys, config.rate_limit_rps, config.kv_mode) == \
        ("0.0.0.0", 9000, ("a", "b"), 5, "raw")
    with pytest.raises(SettingsError, match="unknown"):
        GatewayConfig.from_settings({"gateway": {"rate_limit": 5}})
    with pytest.raises(SettingsError):
        GatewayConfig.from_settings({"gateway": {"port": -1}})
    assert kv_mode_name({}) == "int8+auto"


def test_the_shipped_config_is_valid():
    from nodes.config_file import load_settings
    GatewayConfig.from_settings(load_settings())

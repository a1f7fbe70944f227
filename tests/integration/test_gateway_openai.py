"""The gateway through off-the-shelf clients over real sockets: the official `openai` package
(completions and chat, streaming and not) and plain httpx, in front of a real tiny-model cluster
(1 prefill + 1 decode process, raw KV): greedy streaming equals non-streaming, usage and
finish_reason are right, the `pdbus` object and X-Pdbus-* headers say who served the request,
sessions stick, and /v1/models, /health, /ready, /metrics answer."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.integration.gateway_helpers import TINY_NAME

pytestmark = pytest.mark.integration
PROMPT = "Once upon a time there was a little model"


def test_completion_non_streaming_with_transparency_headers(client):
    raw = client.completions.with_raw_response.create(model=TINY_NAME, prompt=PROMPT, max_tokens=12, temperature=0,
                                                      extra_body={"ignore_eos": True})
    completion = raw.parse()
    assert completion.choices[0].finish_reason == "length" and completion.choices[0].text
    assert completion.usage.completion_tokens == 12 and completion.usage.prompt_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + 12
    info = completion.model_extra["pdbus"]
    assert (info["prefill_node"], info["decode_node"], info["kv_mode"], info["failover"]) == \
        ("prefill-0", "decode-0", "raw", False)
    assert raw.headers["X-Pdbus-Prefill-Node"] == "prefill-0" and raw.headers["X-Pdbus-Decode-Node"] == "decode-0"
    assert raw.headers["X-Pdbus-KV-Mode"] == "raw" and raw.headers["X-Pdbus-Failover"] == "false"


def test_completion_streaming_equals_non_streaming_and_reports_usage(client):
    options = dict(model=TINY_NAME, prompt=PROMPT, max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**options).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **options))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["pdbus"]["decode_node"] == "decode-0"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_chat_streaming_and_not_agree(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}]
    options = dict(model=TINY_NAME, messages=messages, max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    chat = client.chat.completions.create(**options)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(stream=True, **options))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == chat.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length" and "pdbus" in chunks[-1].model_extra


def test_stop_string_and_seeded_sampling(client):
    text = client.completions.create(model=TINY_NAME, prompt=PROMPT, max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = text[len(text) // 2:][:2]
    stopped = client.completions.create(model=TINY_NAME, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True}).choices[0]
    assert stopped.finish_reason == "stop" and stop not in stopped.text
    sampled = [client.completions.create(model=TINY_NAME, prompt=PROMPT, max_tokens=8, temperature=1.0, seed=3,
                                         top_p=0.9, extra_body={"ignore_eos": True, "top_k": 20}).choices[0].text
               for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_a_session_header_keeps_the_turns_on_one_decode_node(served):
    _, gateway = served
    first = httpx.post(f"{gateway.url}/v1/chat/completions", headers={"X-Session-Id": "chat-1"}, timeout=60, json={
        "model": TINY_NAME, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0})
    reply = first.json()["choices"][0]["message"]["content"]
    second = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=60, json={
        "model": TINY_NAME, "session_id": "chat-1", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": reply},
                     {"role": "user", "content": "And then?"}]})
    assert first.headers["X-Session-Id"] == second.headers["X-Session-Id"] == "chat-1"
    assert second.json()["pdbus"]["plans"] == ["cached"]   # the follow-up reused the session's KV
    assert second.headers["X-Pdbus-KV-Mode"] == "none"


def test_models_health_ready_and_metrics(served, client):
    _, gateway = served
    assert [m.id for m in client.models.list().data] == [TINY_NAME]
    assert httpx.get(f"{gateway.url}/health").json() == {"status": "ok"}
    ready = httpx.get(f"{gateway.url}/ready").json()
    assert ready == {"ready": True, "broker": True, "services": {"prefill": True, "decode": True}}
    client.completions.create(model=TINY_NAME, prompt=PROMPT, max_tokens=4)
    text = httpx.get(f"{gateway.url}/metrics").text
    for name in ("pdbus_time_to_first_token_seconds_count", "pdbus_time_per_output_token_seconds_count",
                 "pdbus_inter_token_latency_seconds_count", "pdbus_e2e_request_latency_seconds_count",
                 'pdbus_stage_seconds_count{stage="prefill"}', 'pdbus_kv_bytes_total{kind="wire"}',
                 "pdbus_kv_transfer_seconds_count", "pdbus_kv_checksum_failures_total", "pdbus_kv_resends_total",
                 'pdbus_nodes_live{role="decode"} 1.0', 'pdbus_nodes_live{role="prefill"} 1.0',
                 'pdbus_broker_queued_requests{service="decode"} 0.0',
                 'pdbus_requests_total{endpoint="completions",outcome="ok"}', "pdbus_failovers_total",
                 'pdbus_service_available{service="decode"} 1.0', "pdbus_requests_in_flight",
                 "pdbus_stream_buffered_tokens"):
        assert name in text, name
    assert "_created" not in text


def test_access_log_names_request_session_nodes_and_timings(served, client):
    _, gateway = served
    completion = client.completions.create(model=TINY_NAME, prompt=PROMPT, max_tokens=3)
    line = gateway.proc.wait_for("access", request_id=completion.id)
    assert line["outcome"] == "ok" and line["decode_node"] == "decode-0" and line["prefill_node"] == "prefill-0"
    assert line["session_id"] and line["ttft_s"] > 0 and line["num_tokens"] == 3


def test_the_request_vllm_bench_serve_sends(served):
    """`vllm bench serve --backend openai --ignore-eos`'s payload, read the way it reads the stream."""
    _, gateway = served
    payload = {"model": TINY_NAME, "prompt": PROMPT, "temperature": 0.0, "max_tokens": 12, "logprobs": None,
               "best_of": 1, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
               "repetition_penalty": 1.0}
    texts, usage = [], None
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=payload, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            chunk = line.removeprefix("data: ")
            if not line or chunk == "[DONE]":
                continue
            data = json.loads(chunk)
            if choices := data.get("choices"):
                texts.append(choices[0]["text"])
            elif data.get("usage"):
                usage = data["usage"]
    assert usage["completion_tokens"] == 12 and "".join(texts)


def test_a_shared_prompt_prefix_is_served_from_the_prefill_cache_and_changes_no_token(client, served):
    """Three requests opening with one long system text, each in its own session. The second
    repeats the first: the decode node holds all but its last few tokens (kept with the first
    request's session) and prefills the rest itself (`cached`), generating what the first did. The
    third asks a long new question: its plan is `remote`, the prefill node takes the opening from
    its prefix cache, and the decode node, holding it too, is sent only the rest. Usage's
    cached_tokens and `pdbus.kv_held_tokens` say so."""
    system = "You are a careful assistant. Answer briefly and cite nothing. " * 2
    texts, cached, held, plans = [], [], [], []
    for i, question in enumerate(("One? " * 40, "One? " * 40, "Two! " * 40)):
        completion = client.completions.create(model=TINY_NAME, prompt=system + question, max_tokens=8, temperature=0,
                                               extra_body={"ignore_eos": True, "session_id": f"prefix-{i}"})
        texts.append(completion.choices[0].text)
        cached.append(completion.usage.prompt_tokens_details.cached_tokens)
        held.append(completion.model_extra["pdbus"]["kv_held_tokens"])
        plans += completion.model_extra["pdbus"]["plans"]
    assert plans == ["remote", "cached", "remote"]
    assert cached[0] == 0 and cached[1] > cached[2] > 0 and cached[2] % 16 == 0
    assert held == [0, 0, cached[2]]   # a cached plan moves no KV at all: nothing to hold back
    assert texts[1] == texts[0]   # a hit changes no token (raw KV, greedy)
    metrics = httpx.get(served[1].url + "/metrics", timeout=10).text
    line = next(x for x in metrics.splitlines() if x.startswith('pdbus_tokens_total{kind="prompt_cached"}'))
    assert float(line.split()[-1]) >= cached[1] + cached[2]
    line = next(x for x in metrics.splitlines() if x.startswith('pdbus_tokens_total{kind="prompt_kv_held"}'))
    assert float(line.split()[-1]) >= held[2]
    # The prefill node's own counters reach /metrics through the broker's stats (its capacity reports).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = httpx.get(served[1].url + "/metrics", timeout=10).text
        rows = {x.split()[0]: float(x.split()[-1]) for x in metrics.splitlines() if x.startswith("pdbus_prefi")}
        if rows.get('pdbus_prefill_prompt_tokens{kind="cached",node="prefill-0"}', 0) >= cached[2]:
            break
        time.sleep(0.2)
    assert rows['pdbus_prefill_prompt_tokens{kind="cached",node="prefill-0"}'] >= cached[2]
    assert 0 < rows["pdbus_prefix_cache_hit_ratio"] < 1

"""Sessions belong to the API key that made them: two keys sending the same session id reach two
different cluster sessions (so key B can neither see key A's cached conversation in `plans` nor
evict it), one key keeps its session across turns, the client always sees its own session id,
and the raw key never reaches the cluster or the rate limiter. Without API keys there is one
tenant and the session id goes to the cluster as given."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from bus.constants import MAX_ID_BYTES
from nodes.cluster import RequestTrace
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.app import Gateway, build_app
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_settings import GatewayConfig, SettingsError
from nodes.gateway.protect import hash_api_key
from tests.nodes.gateway.test_app import FakeClient, FakeGeneration

KEY_A, KEY_B = "sk-tenant-a-secret", "sk-tenant-b-secret"
BODY = {"model": "m", "prompt": "Hello", "max_tokens": 2}


class SessionClient(FakeClient):
    """Plans like a decode node with a session cache: `cached` once the cluster session is known."""

    def __init__(self) -> None:
        super().__init__()
        self.session_ids: list[str] = []
        self.cache_salts: list[str] = []

    def generate(self, prompt, sampling, *, session_id=None, request_id=None, cache_salt="", **fork):
        plan = "cached" if session_id in self.session_ids else "remote"
        self.session_ids.append(session_id)
        self.cache_salts.append(cache_salt)
        generation = FakeGeneration(prompt, sampling, "ok")
        generation.trace = RequestTrace(request_id, session_id, decode_node_ids=["decode-0"], plans=[plan])
        self.generations.append(generation)
        return generation


async def serving(api_keys: tuple[str, ...], **settings):
    config = GatewayConfig(model_name="m", api_keys=api_keys, **settings)
    fake = SessionClient()
    gateway = Gateway(config, Backend(fake, ModelInfo(tiny_tokenizer(512), 2048), config))
    client = TestClient(TestServer(build_app(gateway)))
    await client.start_server()
    return client, fake, gateway


@pytest.fixture
async def keyed():
    client, fake, gateway = await serving((KEY_A, hash_api_key(KEY_B)))
    yield client, fake, gateway
    await client.close()


async def post(client, key: str | None, **extra) -> tuple[dict, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = await client.post("/v1/completions", json={**BODY, **extra}, headers=headers)
    assert response.status == 200, await response.text()
    return await response.json(), dict(response.headers)


async def test_two_keys_with_one_session_id_reach_two_cluster_sessions(keyed):
    client, fake, _ = keyed
    first_a, _ = await post(client, KEY_A, session_id="chat-1")
    first_b, headers_b = await post(client, KEY_B, session_id="chat-1")
    second_a, _ = await post(client, KEY_A, session_id="chat-1")
    session_a, session_b, again_a = fake.session_ids
    assert session_a != session_b and again_a == session_a   # scoped, and sticky for the same key
    assert first_b["pdbus"]["plans"] == ["remote"]            # B does not see A's cached conversation
    assert second_a["pdbus"]["plans"] == ["cached"]           # and did not take it over
    for info, headers in ((first_a["pdbus"], {}), (first_b["pdbus"], headers_b)):
        assert info["session_id"] == "chat-1" and headers.get("X-Session-Id", "chat-1") == "chat-1"


async def test_the_cluster_session_id_is_bounded_and_holds_no_key(keyed):
    client, fake, gateway = keyed
    await post(client, KEY_A, session_id="s" * 96)
    await post(client, KEY_B)
    for session_id in fake.session_ids:
        assert len(session_id.encode()) <= MAX_ID_BYTES and session_id.isascii()
        for secret in (KEY_A, KEY_B, hash_api_key(KEY_A)[7:], hash_api_key(KEY_B)[7:]):
            assert secret not in session_id
    assert not any(KEY_A in identity or KEY_B in identity for identity in gateway.limiter.buckets)


async def test_a_session_the_gateway_made_up_can_be_continued_by_its_key_only(keyed):
    client, fake, _ = keyed
    _, headers = await post(client, KEY_A)
    made_up = headers["X-Session-Id"]
    second, _ = await post(client, KEY_A, session_id=made_up)
    other, _ = await post(client, KEY_B, session_id=made_up)
    assert second["pdbus"]["plans"] == ["cached"] and other["pdbus"]["plans"] == ["remote"]
    assert fake.session_ids[0] == fake.session_ids[1] != fake.session_ids[2]


async def test_the_websocket_scopes_sessions_by_its_key_too(keyed):
    client, fake, _ = keyed
    await post(client, KEY_A, session_id="chat-ws")
    url = str(client.make_url("/v1/stream"))
    async with aiohttp.ClientSession() as session, session.ws_connect(f"{url}?api_key={KEY_B}") as ws:
        await ws.send_json({**BODY, "session_id": "chat-ws"})
        while (message := await ws.receive_json(timeout=5))["type"] == "token":
            pass
    assert message["type"] == "done" and message["pdbus"]["plans"] == ["remote"]
    assert message["pdbus"]["session_id"] == "chat-ws" and fake.session_ids[0] != fake.session_ids[1]


async def test_without_api_keys_there_is_one_tenant():
    client, fake, _ = await serving(())
    try:
        await post(client, None, session_id="chat-1")
        second, _ = await post(client, None, session_id="chat-1")
    finally:
        await client.close()
    assert fake.session_ids == ["chat-1", "chat-1"] and second["pdbus"]["plans"] == ["cached"]


async def test_each_key_scopes_its_cached_prompt_prefixes_unless_the_operator_shares_them(keyed):
    """The salt the prefill nodes' prefix caches key on: one per key (no key's prompts can be timed
    by another), bounded, holding no key; `share_prefix_cache = true` lets every key share."""
    client, fake, _ = keyed
    for key in (KEY_A, KEY_B, KEY_A):
        await post(client, key)
    salt_a, salt_b, again_a = fake.cache_salts
    assert salt_a and salt_a != salt_b and again_a == salt_a
    for salt in (salt_a, salt_b):
        assert len(salt.encode()) <= MAX_ID_BYTES and KEY_A not in salt and KEY_B not in salt
    shared, fake, _ = await serving((KEY_A, KEY_B), share_prefix_cache=True)
    try:
        for key in (KEY_A, KEY_B):
            await post(shared, key)
    finally:
        await shared.close()
    assert fake.cache_salts == ["", ""]


def test_share_prefix_cache_must_be_a_boolean():
    with pytest.raises(SettingsError, match="share_prefix_cache"):
        GatewayConfig.from_settings({"gateway": {"share_prefix_cache": "yes"}})

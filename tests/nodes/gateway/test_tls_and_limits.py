"""Gateway hardening on a real socket: HTTPS with a self-signed certificate (made by the openssl
CLI), API keys accepted hashed in the config, and header/body limits answering a clear 4xx."""

from __future__ import annotations

import asyncio
import shutil
import socket
import ssl
import subprocess

import aiohttp
import pytest

from nodes.config_file import SettingsError
from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.api_errors import ApiError
from nodes.gateway.app import Gateway, serve, tls_context
from nodes.gateway.backend import Backend, ModelInfo
from nodes.gateway.gateway_settings import GatewayConfig
from nodes.gateway.protect import check_api_key, hash_api_key
from tests.nodes.gateway.test_app import FakeClient

KEY = "sk-test-very-secret"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("no openssl CLI to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _serving(config: GatewayConfig):
    gateway = Gateway(config, Backend(FakeClient(), ModelInfo(tiny_tokenizer(512), 2048), config))
    stop = asyncio.Event()
    task = asyncio.create_task(serve(gateway, stop))
    for _ in range(100):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", config.port)
            writer.close()
            break
        except OSError:
            await asyncio.sleep(0.02)
    return stop, task


@pytest.fixture
async def tls_gateway(certificate):
    cert, key = certificate
    config = GatewayConfig(model_name="m", port=_free_port(), tls_cert=str(cert), tls_key=str(key),
                           api_keys=(hash_api_key(KEY),), max_header_bytes=1024, max_headers=16,
                           max_body_bytes=4096)
    stop, task = await _serving(config)
    client_tls = ssl.create_default_context(cafile=str(cert))
    yield f"https://127.0.0.1:{config.port}", f"http://127.0.0.1:{config.port}", client_tls
    stop.set()
    await task


async def test_https_serves_with_a_hashed_api_key(tls_gateway):
    url, _, client_tls = tls_gateway
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/models", ssl=client_tls,
                               headers={"Authorization": f"Bearer {KEY}"}) as response:
            assert response.status == 200
        async with session.get(f"{url}/v1/models", ssl=client_tls,
                               headers={"Authorization": f"Bearer {hash_api_key(KEY)}"}) as response:
            assert response.status == 401   # the hash itself is not a key


async def test_plain_http_to_the_tls_port_gets_nothing(tls_gateway):
    _, plain_url, _ = tls_gateway
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"{plain_url}/health") as response:
                await response.read()


async def test_an_untrusted_certificate_is_refused_by_a_verifying_client(tls_gateway):
    url, _, _ = tls_gateway
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await session.get(f"{url}/health", ssl=ssl.create_default_context())


@pytest.mark.parametrize(("headers", "what"), [
    ({"X-Big": "a" * 5000}, "a header over max_header_bytes"),
    ({f"X-H{i}": "v" for i in range(40)}, "more headers than max_headers")])
async def test_header_limits_answer_400_and_the_gateway_keeps_serving(tls_gateway, headers, what):
    url, _, client_tls = tls_gateway
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/health", ssl=client_tls, headers=headers) as response:
            assert response.status == 400, what
        async with session.get(f"{url}/health", ssl=client_tls) as response:
            assert response.status == 200


async def test_a_body_over_the_limit_is_413(tls_gateway):
    url, _, client_tls = tls_gateway
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session, session.post(
            f"{url}/v1/completions", ssl=client_tls, data=b"{" + b" " * 10_000 + b"}", headers=headers) as response:
        assert response.status == 413


def test_hashed_and_plain_keys_are_both_accepted_and_compared_whole():
    keys = (hash_api_key("alpha"), "beta")
    assert check_api_key("Bearer alpha", keys) == "alpha"
    assert check_api_key("Bearer beta", keys) == "beta"
    assert check_api_key("Bearer alpha", (hash_api_key("alpha").upper().replace("SHA256:", "sha256:"),)) == "alpha"
    for wrong in ("Bearer alph", "Bearer alphaa", "Bearer " + hash_api_key("alpha"), "Bearer bet"):
        with pytest.raises(ApiError) as info:
            check_api_key(wrong, keys)
        assert info.value.status == 401


def test_tls_settings_are_checked(tmp_path):
    with pytest.raises(SettingsError, match="go together"):
        GatewayConfig.from_settings({"gateway": {"tls_cert": "/x.pem"}})
    with pytest.raises(SettingsError, match="max_header_bytes"):
        GatewayConfig.from_settings({"gateway": {"max_header_bytes": 10}})
    config = GatewayConfig(tls_cert=str(tmp_path / "missing.pem"), tls_key=str(tmp_path / "missing.key"))
    with pytest.raises(SettingsError, match="cannot load"):
        tls_context(config)
    assert tls_context(GatewayConfig()) is None

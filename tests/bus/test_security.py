"""bus.security without a broker: key files, admitted roles, endpoints, and the core's role check."""

from __future__ import annotations

import stat

import pytest
import zmq

from bus import codec
from bus.broker_core import BrokerCore
from bus.constants import DisconnectReason
from bus.messages import Disconnect, Ready
from bus.security import (
    SecurityError,
    admitted_keys,
    fingerprint,
    generate_keypair,
    is_loopback,
    load_keypair,
    load_public_key,
    split_server_key,
    with_server_key,
)
from tests.bus.security_helpers import ADMIT, make_keys


def test_generate_writes_a_0600_secret_and_never_overwrites(tmp_path):
    public, secret = generate_keypair(tmp_path, "prefill-1")
    assert len(public) == 40 and len(secret) == 40
    assert stat.S_IMODE((tmp_path / "prefill-1.key_secret").stat().st_mode) == 0o600
    assert secret.decode() not in (tmp_path / "prefill-1.key").read_text()
    assert load_keypair(tmp_path, "prefill-1") == (public, secret)
    with pytest.raises(SecurityError, match="already exists"):
        generate_keypair(tmp_path, "prefill-1")


def test_a_secret_readable_by_others_is_refused(tmp_path):
    generate_keypair(tmp_path, "decode")
    (tmp_path / "decode.key_secret").chmod(0o644)
    with pytest.raises(SecurityError, match="chmod 600"):
        load_keypair(tmp_path, "decode")


@pytest.mark.parametrize("name", ["", "../etc", ".hidden", "a/b"])
def test_bad_key_names_are_refused(tmp_path, name):
    with pytest.raises(SecurityError):
        generate_keypair(tmp_path, name)


def test_missing_keys_fail_with_the_file_named(tmp_path):
    with pytest.raises(SecurityError, match="nobody"):
        load_keypair(tmp_path, "nobody")
    with pytest.raises(SecurityError, match="nobody"):
        load_public_key(tmp_path, "nobody")


def test_admitted_keys_by_name_or_inline_and_several_roles(tmp_path):
    keys = make_keys(tmp_path)
    inline = keys["intruder"][0].decode()
    admitted = admitted_keys(tmp_path, {**ADMIT, "decode": ["decode", "both"], "gateway": [inline]})
    assert admitted[keys["both"][0]].roles == {"both", "decode"}
    assert admitted[keys["decode"][0]].name == "decode"
    assert admitted[keys["intruder"][0]].roles == {"gateway"}
    assert admitted[keys["intruder"][0]].name == fingerprint(inline)   # an inline key is not logged


def test_data_endpoint_carries_the_server_key():
    public, _ = zmq.curve_keypair()
    endpoint = with_server_key("tcp://10.0.0.2:4100", public)
    assert split_server_key(endpoint) == ("tcp://10.0.0.2:4100", public)
    assert split_server_key("tcp://10.0.0.2:4100") == ("tcp://10.0.0.2:4100", None)
    with pytest.raises(SecurityError):
        split_server_key("tcp://h:1;curve=zz")


@pytest.mark.parametrize(("endpoint", "loopback"), [
    ("tcp://127.0.0.1:5555", True), ("tcp://localhost:1", True), ("tcp://[::1]:1", True),
    ("ipc:///tmp/x", True), ("tcp://10.1.2.3:5555", False), ("tcp://*:5555", False),
    ("tcp://0.0.0.0:5555", False), ("tcp://broker.example:5555", False),
    ("tcp://127.0.0.1:5555,tcp://127.0.0.1:5556", True), ("tcp://127.0.0.1:5555,tcp://10.1.2.3:5555", False)])
def test_is_loopback(endpoint, loopback):
    assert is_loopback(endpoint) is loopback


class _Frame(bytes):
    """A received header frame stamped with its sender's key, as zmq metadata would be."""

    user: bytes = b""


def _ready(user: bytes, role: str) -> list:
    header, *rest = codec.encode(Ready(role, f"{role}-1"))
    frame = _Frame(header)
    frame.user = user
    return [frame, *rest]


def test_core_refuses_ready_for_a_role_the_key_lacks(clock):
    roles = {b"gw-key": {"gateway"}, b"decode-key": {"decode"}}
    core = BrokerCore(authorize=lambda frame, role: None if role in roles.get(frame.user, ())
                      else "not admitted")
    core.on_frames(b"id-1", _ready(b"gw-key", "decode"), clock.now)
    core.on_frames(b"id-2", _ready(b"stranger", "gateway"), clock.now)
    replies = [(identity, codec.decode(frames)) for identity, *frames in core.take_outbox()]
    assert replies == [(b"id-1", Disconnect(DisconnectReason.FORBIDDEN, "not admitted")),
                       (b"id-2", Disconnect(DisconnectReason.FORBIDDEN, "not admitted"))]
    assert not core.nodes_by_id and core.metrics["dropped.forbidden"] == 2
    core.on_frames(b"id-3", _ready(b"decode-key", "decode"), clock.now)
    assert set(core.nodes_by_id) == {"decode-1"}

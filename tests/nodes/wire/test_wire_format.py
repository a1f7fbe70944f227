"""The maps the codec builds are byte for byte what docs/CLUSTER.md describes (and what every peer,
the harness and the vLLM tests read): the same keys, in the same order, of the same msgpack types.
Enum members go out as their plain string values."""

from __future__ import annotations

import pytest

from bus import codec
from nodes import wire

SAMPLING = wire.SamplingParams(temperature=0.0, max_tokens=6, stop=("\n",), stop_token_ids=(2,), ignore_eos=True)
SAMPLING_MAP = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": None, "max_tokens": 6, "stop": ["\n"],
                "stop_token_ids": [2], "ignore_eos": True}
TOKEN = wire.TokenBody(1, 42, "hi")
CASES = [
    (wire.DecodeRequestBody((1, 2), SAMPLING, "s", wire.PrefillMode.LOCAL, 3),
     {"prompt_token_ids": [1, 2], "sampling": SAMPLING_MAP, "session_id": "s", "prefill": "local",
      "resume": {"num_delivered": 3}}),
    (wire.DecodeRequestBody((1, 2), SAMPLING, "s"),
     {"prompt_token_ids": [1, 2], "sampling": SAMPLING_MAP, "session_id": "s", "prefill": "auto", "resume": None}),
    (wire.PrefillRequestBody((1, 2), SAMPLING, "d", "tcp://h:1", "t", "r", True),
     {"prompt_token_ids": [1, 2], "sampling": SAMPLING_MAP, "decode_node_id": "d", "data_endpoint": "tcp://h:1",
      "transfer_id": "t", "request_id": "r", "urgent": True}),
    (wire.PlanBody.remote("d", "tcp://h:1", "t"),
     {"type": "plan", "plan": "remote", "node_id": "d", "data_endpoint": "tcp://h:1", "transfer_id": "t"}),
    (wire.PlanBody.cached("d", 7), {"type": "plan", "plan": "cached", "node_id": "d", "num_cached_tokens": 7}),
    (wire.PlanBody.local("d"), {"type": "plan", "plan": "local", "node_id": "d"}),
    (TOKEN, {"type": "token", "index": 1, "token_id": 42, "text": "hi"}),
    (wire.KvReadyBody("r", "t", 5), {"type": "kv_ready", "request_id": "r", "transfer_id": "t", "first_token_id": 5}),
    (wire.PrefillDoneBody("p", wire.TokenBody(0, 42, "hi"), wire.TransferReport("t", "int8", "none", 8, 4, 0, 0, 0, 0.5),
                          wire.PrefillTimings(0.0, 0.25, None), {"num_prefilled_tokens": 2, "num_kv_bytes_sent": 4}),
     {"type": "done", "node_id": "p", "token": [0, 42, "hi"],
      "transfer": {"transfer_id": "t", "mode": "int8", "compression": "none", "raw_bytes": 8, "wire_bytes": 4,
                   "retries": 0, "checksum_failures": 0, "resends": 0, "seconds": 0.5},
      "timings": {"queue_s": 0.0, "prefill_s": 0.25, "kv_transfer_s": None},
      "stats": {"num_prefilled_tokens": 2, "num_kv_bytes_sent": 4}}),
    (wire.DecodeDoneBody("d", "length", (TOKEN,), wire.PlanKind.REMOTE, wire.Usage(2, 2),
                         wire.DecodeTimings(0.5, None, 1.0), {"kv_raw_bytes": 8}),
     {"type": "done", "node_id": "d", "finish_reason": "length", "tokens": [[1, 42, "hi"]], "plan": "remote",
      "usage": {"prompt_tokens": 2, "completion_tokens": 2},
      "timings": {"kv_wait_s": 0.5, "decode_queue_s": None, "decode_s": 1.0}, "stats": {"kv_raw_bytes": 8}}),
]


@pytest.mark.parametrize(("body", "expected"), CASES, ids=lambda value: type(value).__name__)
def test_each_body_goes_out_as_the_documented_map(body, expected):
    sent = wire.to_wire(body)
    assert sent == expected and list(sent) == list(expected)
    assert codec.pack(sent) == codec.pack(expected)   # byte for byte: enum members pack as plain strings


def test_codes_travel_and_compare_as_their_values():
    assert codec.pack({"code": wire.Code.KV_FAILED}) == codec.pack({"code": "kv_failed"})
    assert wire.Code.KV_FAILED == "kv_failed" and "kv_failed" in {wire.Code.KV_FAILED}   # as a peer sends it
    assert f"{wire.Code.FULL}@d" == "full@d"

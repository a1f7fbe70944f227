"""Hypothesis strategies for hostile traffic: every message kind of docs/PROTOCOL.md parts 1 and 2
and the gateway's HTTP and WebSocket requests, well-formed where a peer checks first (headers,
signatures, trailers) and mutated where it has to trust (fields, bodies, frame counts).

Contract (pure: no sockets, no clocks; every strategy draws only bytes, str and plain values;
`Known`, `pack`, `kv_header` and `forged_transfer` come from harness/fuzz/forged_frames.py):
- `control(known) -> (kind, frames)`: one control-plane message, kind a command name or `garbage`;
  fields get wrong types, huge/negative/non-finite numbers, over-long, empty or non-UTF-8 strings,
  deep nesting, hand-made msgpack; frames go missing, repeat, grow many or big.
- `replies(role) -> [(Command, seq | None, body)]`: what a hostile node answers a REQUEST with.
- `kv(known) -> (kind, frames)`: one KV message: CHUNK/END/ABORT (and the receiver-bound
  ACK/NACK/DONE) with mutated fields under a VALID xxh3_64 trailer (`kv_header`), consistent CHUNK
  headers of extreme geometry, chunks of forged transfers (NaN or infinite values, valid checksums),
  and garbage.
The gateway's HTTP and WebSocket traffic is harness/fuzz/http_strategies.py.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import msgpack
from hypothesis import strategies as st

from bus import codec
from bus import constants as c
from bus.constants import Command
from bus.kv import frames as kvf
from bus.kv.layout import ChunkSpec, KVInfo
from bus.kv.quant import payload_sizes
from harness.fuzz.forged_frames import Known, chunk_fields, forged_transfer, kv_header, pack

MODEL_NAME = "SmolLM2-135M-Instruct"
HUGE_INTS = [2**64 - 1, 2**63, 2**63 - 1, -(2**63), 2**32, 2**31, -(2**31) - 1, -1, 0]
NON_FINITE = [math.nan, math.inf, -math.inf]
SURROGATES: tuple[Literal["Cs"]] = ("Cs",)   # the unicode category of lone surrogates
BAD_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\x80abc", b"\xfe\xfe\xff"]


def weighted(*choices: tuple[int, st.SearchStrategy]) -> st.SearchStrategy:
    """One of `choices` by weight, the first the most likely. Not `one_of`: it drops repeated
    branches, flattens nested ones into branches of their own and, generating novel examples,
    spreads over its branches about evenly whatever they hold; a drawn percentile picks instead
    (hypothesis favours small integers, which favours the first choice a little more)."""
    total = sum(weight for weight, _ in choices)
    bounds = [sum(w for w, _ in choices[: i + 1]) * 100 / total for i in range(len(choices))]
    return st.integers(0, 99).flatmap(lambda p: choices[next(i for i, b in enumerate(bounds) if p < b)][1])


def mostly(valid: st.SearchStrategy, hostile: st.SearchStrategy) -> st.SearchStrategy:
    """Valid about three times in four: deeper code runs only when the fields before it pass."""
    return weighted((3, valid), (1, hostile))


# -- hostile values --------------------------------------------------------------------------
texts = st.text(st.characters(exclude_categories=SURROGATES), max_size=24)
# Over-long strings (129 B .. 1 MiB), the longest rarely: each costs a megabyte on every hop.
long_texts = st.sampled_from([129, 1000, 4096, 65_536, 65_536, 2**20]).map(lambda n: "x" * n)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.sampled_from(HUGE_INTS),
                    st.floats(), st.sampled_from(NON_FINITE), texts, st.binary(max_size=24))
nested = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(texts, kids, max_size=4),
                      max_leaves=6)
values = weighted((7, nested), (1, long_texts))


RAW_MSGPACK = [b"", b"\xc1", b"\x91" * 100_000 + b"\xc0", b"\x81" * 5000 + b"\xc0", b"\xdd\xff\xff\xff\xff",
               b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff", b"\xa4\xff\xfe\xfd\xfc", b"\x81\xc0\xc0",
               b"\x81\x01\x02", b"\x81\x91\x01\x02", b"\xd6\xff\x00\x00\x00\x01", b"\xc7\x0c\xff" + b"\xff" * 12,
               b"\xd4\x05\x00", pack({"role": "decode"}) + b"\x00", pack({b"role": b"decode"}),
               b"\x81\xa4role\xa4\xff\xfe\xfd\xfc", b"\xcb\x7f\xf8\x00\x00\x00\x00\x00\x01"]
raw_msgpack = st.sampled_from(RAW_MSGPACK)


def body(template: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """A msgpack body: the template with mutated fields, any hostile value, or hand-made bytes."""
    return weighted((2, template.map(pack)), (1, values.map(pack)), (1, raw_msgpack))


def mutated(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict]:
    """A map with the template's keys, each value hostile one time in four; keys dropped, keys added."""
    base = st.fixed_dictionaries({k: mostly(v, values) for k, v in fields.items()})
    extra = st.dictionaries(st.one_of(texts, st.sampled_from(sorted(fields))), values, max_size=2)
    drops = st.sets(st.sampled_from(sorted(fields)), max_size=2)
    return st.builds(lambda d, x, gone: {k: v for k, v in {**d, **x}.items() if k not in gone}, base, extra, drops)


def id_frame(valid: st.SearchStrategy[str]) -> st.SearchStrategy[bytes]:
    return mostly(valid.map(str.encode), st.one_of(
        st.just(b""), st.sampled_from(BAD_UTF8), st.binary(max_size=16), st.integers(129, 4096).map(lambda n: b"r" * n)))


def known_id(known: Known, name: str, fallback: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(fallback, st.integers(0, 2**16).map(lambda i: known.pick(name, i, "r-none")))


hex_ids = st.uuids().map(lambda u: u.hex)
tokens = st.lists(st.integers(0, 511), min_size=1, max_size=12)
hostile_tokens = st.one_of(st.sampled_from([2047, 2048, 5000]).map(lambda n: [7] * n),
                           st.lists(st.sampled_from([-1, 512, 2**31, 2**63 - 1]), min_size=1, max_size=3))
prompts = mostly(tokens, hostile_tokens)
endpoints = st.one_of(st.integers(1, 65535).map(lambda p: f"tcp://127.0.0.1:{p}"), st.sampled_from(
    ["", "garbage", "tcp://", "tcp://[::1", "inproc://x", "ipc://@pdbus-fuzz", "tcp://127.0.0.1:1;curve=zz",
     "tcp://256.1.1.1:5", "udp://127.0.0.1:9", "tcp://127.0.0.1:99999"]))
sampling = mutated({"temperature": st.sampled_from([0.0, 0.5]), "max_tokens": st.integers(1, 4),
                    "ignore_eos": st.booleans(), "top_p": st.just(1.0), "top_k": st.integers(0, 5),
                    "seed": st.integers(0, 9), "stop": st.lists(texts, max_size=2),
                    "stop_token_ids": st.lists(st.integers(0, 511), max_size=2)})


def request_body(known: Known) -> st.SearchStrategy[dict]:
    decode = mutated({"prompt_token_ids": prompts, "sampling": sampling, "session_id": hex_ids,
                      "prefill": st.sampled_from(["auto", "local"]), "resume": values})
    prefill = mutated({"prompt_token_ids": prompts, "sampling": sampling,
                       "decode_node_id": known_id(known, "node_ids", texts), "transfer_id": hex_ids,
                       "data_endpoint": known_id(known, "data_endpoints", endpoints),
                       "request_id": known_id(known, "request_ids", hex_ids), "urgent": st.booleans()})
    return st.one_of(decode, prefill)


def kv_ready_body(known: Known) -> st.SearchStrategy[dict]:
    return mutated({"type": st.just("kv_ready"), "request_id": known_id(known, "request_ids", hex_ids),
                    "transfer_id": hex_ids, "first_token_id": st.integers(0, 511)})


REPLY_BODIES: dict[str, dict[str, st.SearchStrategy]] = {
    "token": {"type": st.just("token"), "index": st.integers(0, 4), "token_id": st.integers(0, 511), "text": texts},
    "plan": {"type": st.just("plan"), "plan": st.sampled_from(["remote", "cached", "local", "?"]), "node_id": texts,
             "data_endpoint": endpoints, "transfer_id": hex_ids, "num_cached_tokens": st.integers(0, 8)},
    "done": {"type": st.just("done"), "node_id": texts, "finish_reason": st.sampled_from(["length", "stop", "?"]),
             "tokens": st.lists(st.tuples(st.integers(0, 4), st.integers(0, 511), texts).map(list), max_size=3),
             "token": st.tuples(st.just(0), st.integers(0, 511), texts).map(list), "plan": texts,
             "usage": mutated({"prompt_tokens": st.integers(0, 9), "completion_tokens": st.integers(0, 9)}),
             "timings": st.dictionaries(texts, values, max_size=2), "stats": st.dictionaries(texts, values, max_size=2),
             "transfer": st.dictionaries(texts, values, max_size=2)},
}
reply_body = st.one_of(*(mutated(fields) for fields in REPLY_BODIES.values()))
error_body = mutated({"code": st.sampled_from(["node_lost", "overloaded", "full", "kv_failed", "no_node", "x"]),
                      "message": texts, "details": mutated({"node_id": texts, "num_replies": st.integers(0, 9),
                                                            "retry_after_s": st.floats(0, 2)})})
seq_frame = mostly(st.integers(0, 8).map(codec.encode_seq), st.one_of(
    st.sampled_from([codec.encode_seq(2**64 - 1), codec.encode_seq(2**63)]), st.binary(max_size=12)))


def control_bodies(known: Known) -> dict[Command, list]:
    """Per command, the frames after the header (each a strategy of bytes)."""
    capacity = st.dictionaries(st.sampled_from(["kv_blocks_total", "kv_blocks_free", "max_running", "full",
                                                "max_batch_tokens", "queued_tokens", "num_running", "x"]),
                               mostly(st.integers(0, 512), st.one_of(st.sampled_from(NON_FINITE + HUGE_INTS),
                                                                     st.floats(), values)), max_size=6)
    ids = st.lists(hex_ids, max_size=4) | st.integers(0, 2000).map(lambda n: [f"r{i}" for i in range(n)])
    services = st.sampled_from(["decode", "prefill", "both", "gateway", c.BROKER_STATS_SERVICE, "nope"])
    request_ids = known_id(known, "request_ids", hex_ids)
    return {
        Command.READY: [body(mutated({
            "role": st.sampled_from(c.ROLES), "node_id": st.integers(0, 99).map(lambda n: f"fuzz-ghost-{n}"),
            "capacity": capacity, "data_endpoint": endpoints, "inflight": ids, "pending": ids}))],
        Command.HEARTBEAT: [],
        Command.DISCONNECT: [body(mutated({"reason": st.sampled_from(["shutdown", "malformed", "x"]),
                                           "detail": texts}))],
        Command.CAPACITY: [body(mutated({"capacity": capacity}))],
        Command.REQUEST: [id_frame(services), id_frame(request_ids), id_frame(st.just("")), id_frame(hex_ids),
                          body(request_body(known))],
        Command.PARTIAL: [id_frame(request_ids), seq_frame, body(reply_body)],
        Command.FINAL: [id_frame(request_ids), seq_frame, body(reply_body)],
        Command.ERROR: [id_frame(st.one_of(st.just(""), request_ids)), body(error_body)],
        Command.DIRECT: [id_frame(known_id(known, "node_ids", texts)), body(st.one_of(kv_ready_body(known), values))],
        Command.CANCEL: [id_frame(request_ids), body(mutated({"reason": st.sampled_from(["client", "client_lost"])}))],
        # STREAMS: a flat [id (bin), seq, ...] index (live ids often, bad pairs sometimes) and bodies.
        Command.STREAMS: [body(st.lists(st.tuples(mostly(request_ids.map(str.encode), values),
                                                  mostly(st.integers(0, 8), values)), min_size=1, max_size=8)
                               .map(lambda pairs: [x for pair in pairs for x in pair])),
                          body(st.lists(reply_body, max_size=8))],
        Command.ADOPT: [body(mutated({"inflight": ids, "pending": ids}))],
        # CONTROL: never a well-formed `drain` (an admitted controller may end a node: that is its
        # job, not a fault); bad actions and roles, and switches the fuzz cluster's nodes refuse.
        Command.CONTROL: [id_frame(known_id(known, "node_ids", texts)), body(mutated({
            "action": st.sampled_from(["role", "x", "", "undrain"]),
            "role": st.sampled_from(["prefill", "decode", "gateway", "king"])}))],
    }


def header_frame(command: Command) -> st.SearchStrategy[bytes]:
    good = codec.HEADERS[command]
    return mostly(st.just(good), st.one_of(
        st.integers(0, 255).map(lambda v: good[:3] + bytes((v, command))),
        st.integers(0, 255).map(lambda cmd: good[:4] + bytes((cmd,))),
        st.sampled_from([good[:4], good + b"\x00", b"MDPW01", b""])))


def reshape(frames: list[bytes], how: int, where: int, extra: int) -> list[bytes]:
    """Frame-level mutations: 0-5 none, 6 drop one, 7 repeat one, 8 many frames, 9 one big frame."""
    where = where % len(frames)
    if how == 6 and len(frames) > 1:
        return frames[:where] + frames[where + 1:]
    if how == 7:
        return frames[:where + 1] + frames[where:]
    if how == 8:
        return frames + [b"p"] * (extra % 512)
    if how == 9:
        return frames + [b"\x00" * (1 << (10 + extra % 11))]   # 1 KiB .. 1 MiB
    return frames


def control(known: Known) -> st.SearchStrategy[tuple[str, list[bytes]]]:
    def message(command: Command) -> st.SearchStrategy[tuple[str, list[bytes]]]:
        parts = st.tuples(header_frame(command), *control_bodies(known)[command]).map(list)
        shaped = st.builds(reshape, parts, st.integers(0, 9), st.integers(0, 63), st.integers(0, 2**16))
        return shaped.map(lambda frames: (command.name, frames))
    garbage = st.lists(st.binary(max_size=64), min_size=1, max_size=8).map(lambda f: ("garbage", f))
    return st.one_of(*(message(cmd) for cmd in Command), garbage)


def replies(role: str) -> st.SearchStrategy[list[tuple[Command, int | None, bytes]]]:
    """A hostile node's answer to a REQUEST: replies with (mostly) consecutive seqs, any bodies."""
    reply = st.tuples(st.sampled_from([Command.PARTIAL, Command.PARTIAL, Command.FINAL, Command.ERROR]),
                      weighted((2, st.none()), (1, st.integers(0, 2**64 - 1))), body(reply_body))
    return st.lists(reply, min_size=0, max_size=6)


first_token_ids = mostly(st.integers(0, 511), st.one_of(st.sampled_from(HUGE_INTS + NON_FINITE), values))


# -- KV data plane ---------------------------------------------------------------------------
FILLS = [b"\x00\x00\xc0\x7f", b"\x00\x00\x80\x7f", b"\x00\x00\x80\xff", b"\xff\xff\x7f\x7f", b"\x00\x00\x00\x00"]


@st.composite
def forged_chunk(draw: Any, known: Known) -> tuple[str, list[bytes]]:
    """One chunk of a forged transfer (NaN, infinities, float32 max, zeros), its frames list mutated
    one time in four."""
    layers, heads, dim = draw(st.sampled_from([known.geometry, (1, 1, 1), (2, 1, 4)]))
    shape = (layers, 2, heads, draw(st.integers(1, 40)), dim)
    chunks = forged_transfer(draw(known_id(known, "transfer_ids", hex_ids)), draw(known_id(known, "request_ids", hex_ids)),
                             shape, draw(st.sampled_from(FILLS)))[:-1]
    header, *payload = chunks[draw(st.integers(0, len(chunks) - 1))]
    if draw(st.integers(0, 3)) == 0:   # the frames list (sizes, codecs) replaced: a checksummed lie
        fields = msgpack.unpackb(header[6:-8])
        fields[13] = draw(values)
        header = kv_header(kvf.CHUNK, fields)
    return "CHUNK.forged", [header, *payload]


EXTREME = [1, 2, 3, 64, 1024, 2**16, 2**31 - 1]


@st.composite
def chunk_header(draw: Any, known: Known) -> list:
    """A CHUNK header's fields, consistent (ranges within the shape, sizes from the mode) for the
    engine's geometry or an extreme one (dims up to 2**31-1: sizes are then only guessed), then up to
    two fields replaced by hostile values."""
    layers, heads, dim = draw(st.one_of(st.just(known.geometry), st.tuples(*[st.sampled_from(EXTREME)] * 3)))
    num_tokens = draw(st.one_of(st.integers(1, 64), st.sampled_from(EXTREME)))
    planes = layers * 2 * heads
    p0 = draw(st.integers(0, planes - 1))
    t0 = draw(st.integers(0, num_tokens - 1))
    spec = ChunkSpec(draw(st.integers(0, 7)), p0, draw(st.integers(p0 + 1, planes)), t0,
                     draw(st.integers(t0 + 1, num_tokens)))
    shape = [layers, 2, heads, num_tokens, dim]
    small = (layers, heads, dim) == known.geometry and num_tokens <= 64
    sizes = payload_sizes("raw", spec, KVInfo(tuple(shape), "float32")) if small else [min(spec.num_rows * dim * 4,
                                                                                           2**40 - 1)]
    fields = chunk_fields(draw(known_id(known, "transfer_ids", hex_ids)), draw(known_id(known, "request_ids", hex_ids)),
                          shape, spec, spec.index + draw(st.integers(1, 4)), sizes, draw(st.integers(0, 2**64 - 1)))
    fields[4] = draw(mostly(st.just("raw"), st.sampled_from(["bf16", "int8", "int8_sym"])))
    fields[12] = "f16" if fields[4].startswith("int8") else ""
    for index in draw(st.lists(st.integers(0, len(fields) - 1), max_size=2)):
        fields[index] = draw(values)
    return fields


def kv_templates(known: Known) -> dict[int, st.SearchStrategy]:
    ids, rids, small = known_id(known, "transfer_ids", hex_ids), known_id(known, "request_ids", hex_ids), st.integers(0, 64)

    def fields(*parts: st.SearchStrategy) -> st.SearchStrategy[list]:
        return st.tuples(*(mostly(f, values) for f in parts)).map(list)
    return {kvf.CHUNK: chunk_header(known),
            kvf.END: fields(ids, rids, st.integers(1, 8), st.integers(0, 2**50), st.integers(0, 2**64 - 1)),
            kvf.ABORT: fields(ids, texts), kvf.ACK: fields(ids, small), kvf.NACK: fields(ids, st.integers(-1, 8), texts),
            kvf.DONE: fields(ids, st.booleans(), texts, small, small)}


def kv(known: Known) -> st.SearchStrategy[tuple[str, list[bytes]]]:
    names = {kvf.CHUNK: "CHUNK", kvf.END: "END", kvf.ABORT: "ABORT", kvf.ACK: "ACK", kvf.NACK: "NACK", kvf.DONE: "DONE"}

    def header(kind: int, template: st.SearchStrategy) -> st.SearchStrategy[tuple[str, list[bytes]]]:
        packed = weighted((3, template), (1, values), (1, raw_msgpack))
        version = mostly(st.just(kvf.VERSION), st.integers(0, 255))
        trailer = st.sampled_from([True] * 7 + [False])
        payload = st.lists(st.binary(max_size=256), max_size=3)
        return st.builds(lambda p, v, t, extra: (names[kind], [kv_header(kind, p, v, t), *extra]),
                         packed, version, trailer, payload)
    garbage = st.lists(st.binary(max_size=80), min_size=1, max_size=4).map(lambda f: ("kv.garbage", f))
    odd_kind = st.tuples(st.integers(0, 255), values).map(lambda kv_: ("kv.kind", [kv_header(kv_[0], kv_[1])]))
    headers = [header(kind, template) for kind, template in kv_templates(known).items()]
    return weighted(*[(1, h) for h in headers[1:]], (3, headers[0]), (2, forged_chunk(known)), (1, garbage),
                    (1, odd_kind))

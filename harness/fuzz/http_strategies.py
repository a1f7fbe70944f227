"""Hypothesis strategies for hostile gateway traffic: HTTP requests and WebSocket messages.

Contract (pure, like harness/fuzz/strategies.py): `http_request() -> (kind, raw request bytes)`,
`ws_messages -> [str | bytes]`: generated JSON (wrong types, huge ints, lone surrogates, NaN,
deep nesting, huge strings) in otherwise plausible completion and chat bodies, with the OpenAI
extras (n, best_of, logprobs, echo, penalties, logit_bias, response_format with schemas the
grammar library refuses or once panicked on, guided_*, tools), and odd request lines and headers.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from harness.fuzz.strategies import MODEL_NAME, SURROGATES, long_texts, mostly, tokens, weighted

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(
    [2**64, -(2**63) - 1, 10**300, 10**4000]), st.floats(), st.text(max_size=16),
    st.text(st.characters(categories=SURROGATES), min_size=1, max_size=4))
json_nested = st.recursive(json_scalars, lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(max_size=8), k,
                                                                                             max_size=3), max_leaves=6)
json_values = weighted((7, json_nested), (1, long_texts))


def jmutated(fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy[dict]:
    base = st.fixed_dictionaries({k: mostly(v, json_values) for k, v in fields.items()})
    return st.builds(lambda d, x: {**d, **x}, base, st.dictionaries(st.text(max_size=12), json_values, max_size=2))


COMMON = {"model": st.just(MODEL_NAME), "max_tokens": st.integers(1, 4), "temperature": st.sampled_from([0, 0.7]),
          "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
          "ignore_eos": st.booleans(), "session_id": st.text(max_size=12), "stop": st.lists(st.text(max_size=4),
                                                                                         max_size=2)}
# The OpenAI extras (logprobs, n, penalties, structured output, tools), each sometimes present:
# schemas include one that made llguidance 1.9.1 panic (non-ASCII in `required`).
SCHEMAS = [{"type": "object"}, {"required": "\u00e9" * 80}, {"type": "string", "pattern": "(("},
           {"anyOf": [{"$ref": "#/nope"}]}, {"type": "integer", "minimum": 5, "maximum": 1}]
FORMATS = st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "xml"}]
                          + [{"type": "json_schema", "json_schema": {"name": "s", "schema": x}} for x in SCHEMAS])
TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({
    "name": st.sampled_from(["get", "bad name!", "x" * 80]), "parameters": st.sampled_from(SCHEMAS)})}), max_size=2)
EXTRAS = {"n": st.integers(1, 2), "best_of": st.integers(1, 3), "logprobs": st.integers(0, 3),
          "presence_penalty": st.floats(-2, 2), "logit_bias": st.dictionaries(st.sampled_from(["1", "70", "x", "-1"]),
                                                                              st.floats(-100, 100), max_size=2),
          "response_format": FORMATS, "guided_regex": st.sampled_from(["[a-z]{1,3}", "((", ".*" * 50]),
          "guided_choice": st.lists(st.text(max_size=3), max_size=3)}
extras = st.fixed_dictionaries({}, optional=EXTRAS)
completion = st.builds(lambda body, more: {**body, **more},
                       jmutated({**COMMON, "prompt": st.one_of(st.text(min_size=1, max_size=20), tokens),
                                 "echo": st.booleans()}), extras)
chat = st.builds(lambda body, more: {**body, **more},
                 jmutated({**COMMON, "messages": st.lists(jmutated({"role": st.sampled_from(["user", "system", "tool",
                                                                                            "assistant", "x"]),
                                                                    "content": st.text(max_size=20)}),
                                                          min_size=1, max_size=2)}),
                 st.fixed_dictionaries({}, optional={"tools": TOOLS, "tool_choice": st.sampled_from(
                     ["auto", "required", "none", {"type": "function", "function": {"name": "get"}}]),
                     "top_logprobs": st.integers(0, 3), "logprobs": st.booleans(), "response_format": FORMATS}))
RAW_JSON = [b'"' + b"x" * (1 << 21) + b'"', b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000, b"9" * 100_000, b"NaN",
            b'{"prompt": "\xff\xfe"}', b'{"prompt": "\\ud800", "model": "' + MODEL_NAME.encode() + b'"}', b"{",
            b'{"model": 1e999999, "prompt": -Infinity}', b'{"max_tokens": 1, "max_tokens": "x"}', b"\x00" * 64]


def json_body(template: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    dumped = template.map(lambda v: json.dumps(v).encode())
    return weighted((4, dumped), (1, json_values.map(lambda v: json.dumps(v).encode())), (1, st.sampled_from(RAW_JSON)))


PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/models", "/v1/stream", "/health", "/ready", "/metrics",
         "/v1/completions?x=%ff", "/%ff%fe", "/v1/../v1/completions", "/" + "a" * 9000, "*"]
header_lines = st.lists(st.one_of(
    st.sampled_from([b"Content-Type: application/json", b"Content-Type: text/plain; charset=\xff",
                     b"X-Session-Id: \xff\xfe\x00", b"X-Session-Id: " + b"s" * 8000, b"Authorization: Bearer \x7f",
                     b"Transfer-Encoding: chunked", b"Expect: 100-continue", b"Upgrade: websocket",
                     b"Connection: Upgrade", b"Content-Length: -1", b"Content-Length: 99999999999999999999",
                     b" folded: line", b"NoColon", b"X: " + b"y" * 9000, b"Accept-Encoding: br, gzip, \x00"]),
    st.builds(lambda k, v: k + b": " + v, st.binary(min_size=1, max_size=8), st.binary(max_size=16))), max_size=6)


@st.composite
def http_request(draw: Any) -> tuple[str, bytes]:
    path = draw(st.sampled_from(PATHS))
    method = draw(mostly(st.sampled_from([b"POST", b"GET"]), st.sampled_from([b"PUT", b"P\x00ST", b"X" * 300, b""])))
    version = draw(mostly(st.just(b"HTTP/1.1"), st.sampled_from([b"HTTP/1.0", b"HTTP/9.9", b"HTTP/1.1\x00"])))
    data = draw(json_body(chat if "chat" in path else completion))
    lines = [b"Host: fuzz", *draw(header_lines)]
    length = draw(mostly(st.just(len(data)), st.integers(0, len(data) + 10)))
    if b"Transfer-Encoding: chunked" in lines:
        data = draw(st.sampled_from([b"%x\r\n" % len(data) + data + b"\r\n0\r\n\r\n", b"zz\r\n" + data, b"0\r\n"]))
    else:
        lines.append(b"Content-Length: %d" % length)
    raw = method + b" " + path.encode() + b" " + version + b"\r\n" + b"\r\n".join(lines) + b"\r\n\r\n" + data
    return f"{method[:8].decode(errors='replace')} {path[:24]}", raw


ws_messages = st.lists(st.one_of(
    json_body(completion).map(lambda b: b.decode(errors="replace")), json_body(chat).map(lambda b: b.decode(errors="replace")),
    st.just('{"type": "cancel"}'), st.binary(max_size=64), st.text(max_size=32)), min_size=1, max_size=4)

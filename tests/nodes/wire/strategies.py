"""Hypothesis strategies for the cluster's bodies (nodes/wire/): `bodies[kind]` draws valid bodies of
each kind within `BOUNDS`; `values` draws anything msgpack (raw=False) can hand a reader; `mutated`
turns a valid map into a hostile one."""

from __future__ import annotations

import msgpack
from hypothesis import strategies as st

from nodes import wire
from nodes.engines.grammar_spec import GrammarSpec

BOUNDS = wire.Bounds(vocab_size=512, max_model_len=256, max_tokens=16)
SECRET = "s3cret-value"

# -- anything -------------------------------------------------------------------------------
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.integers(), st.floats(),
                    st.text(max_size=20), st.binary(max_size=8),
                    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
                    st.builds(msgpack.Timestamp, st.integers(0, 2**32 - 1), st.integers(0, 999_999_999)),
                    st.sampled_from([0, 1, -1, 2**31, 2**31 - 1, 511, 512, 15, 16, float("nan"), float("inf"), "",
                                     SECRET]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=12), st.binary(max_size=4)), inner,
                                                 max_size=4)), max_leaves=12)


def mutated(good: dict) -> st.SearchStrategy:
    """`good` with some fields replaced by arbitrary values, dropped, or a whole other value."""
    fields = st.fixed_dictionaries({k: st.one_of(st.just(v), values) for k, v in good.items()})
    dropped = st.sets(st.sampled_from(sorted(good))).flatmap(
        lambda drop: fields.map(lambda body: {k: v for k, v in body.items() if k not in drop}))
    return st.one_of(fields, dropped, values)


# -- valid bodies within BOUNDS ----------------------------------------------------------------
ids = st.text(min_size=1, max_size=20)
no_id = st.just("")
endpoints = st.text(min_size=1, max_size=60)
counts = st.integers(0, 2**63 - 1)
seconds = st.floats(0, 1e6)
token_ids = st.integers(0, BOUNDS.vocab_size - 1)
prompts = st.lists(token_ids, min_size=1, max_size=BOUNDS.max_model_len - 1).map(tuple)
sampling = st.builds(wire.SamplingParams, temperature=st.floats(0, 100), top_k=st.integers(0, 2**31 - 1),
                     top_p=st.floats(0.01, 1), seed=st.none() | st.integers(-(2**63), 2**64 - 1),
                     max_tokens=st.integers(1, 2**31 - 1),
                     stop=st.lists(st.text(min_size=1, max_size=8), max_size=8).map(tuple),
                     stop_token_ids=st.lists(token_ids, max_size=8).map(tuple), ignore_eos=st.booleans(),
                     logprobs=st.none() | st.integers(0, 20), prompt_logprobs=st.none() | st.integers(0, 20),
                     presence_penalty=st.floats(-2, 2), frequency_penalty=st.floats(-2, 2),
                     repetition_penalty=st.floats(0.01, 10),
                     logit_bias=st.lists(st.tuples(token_ids, st.floats(-100, 100)), max_size=4).map(tuple),
                     grammar=st.none() | st.sampled_from([
                         GrammarSpec.json_object(), GrammarSpec.regex("[a-z]{1,8}"), GrammarSpec.choice(["yes", "no"]),
                         GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})]))
logprob_values = st.floats(-1e9, 0)
logprobs = st.none() | st.builds(wire.TokenLogprobs, logprob_values,
                                 st.lists(st.tuples(token_ids, logprob_values), max_size=20).map(tuple))
tokens = st.builds(wire.TokenBody, st.integers(0, BOUNDS.max_tokens - 1), token_ids, st.text(max_size=30), logprobs)
stats = st.dictionaries(st.text(max_size=64), st.integers(0, 2**63 - 1) | st.floats(0, 1e18), max_size=5)
transfers = st.builds(wire.TransferReport, no_id | ids, st.text(max_size=32), st.text(max_size=32), counts, counts,
                      counts, counts, counts, seconds)
optional_seconds = st.none() | seconds

bodies: dict[type, st.SearchStrategy] = {
    wire.DecodeRequestBody: st.builds(wire.DecodeRequestBody, prompts, sampling, st.none() | ids,
                                      st.sampled_from(wire.PrefillMode), counts, st.one_of(st.just(""), ids),
                                      counts, st.one_of(st.just(""), ids)),
    # kv_offset: the leading tokens the decode node holds, always fewer than the prompt's
    wire.PrefillRequestBody: prompts.flatmap(lambda prompt: st.builds(
        wire.PrefillRequestBody, st.just(prompt), sampling, ids, endpoints, ids, ids, st.booleans(),
        st.one_of(st.just(""), ids), st.integers(0, len(prompt) - 1), st.integers(0, len(prompt) - 1))),
    wire.KvReadyBody: st.builds(wire.KvReadyBody, ids, ids, token_ids),
    wire.ControlBody: st.one_of(st.just(wire.ControlBody("drain")),
                                st.sampled_from(wire.SWITCH_ROLES).map(lambda role: wire.ControlBody("role", role))),
    wire.SamplingParams: sampling,
    wire.PlanBody: st.one_of(st.builds(wire.PlanBody.remote, ids, endpoints, ids, counts),
                             st.builds(wire.PlanBody.cached, ids, counts), st.builds(wire.PlanBody.local, ids, counts)),
    wire.TokenBody: tokens,
    wire.TransferReport: transfers,
    wire.PrefillDoneBody: st.builds(wire.PrefillDoneBody, no_id | ids, st.none() | tokens, st.none() | transfers,
                                    st.builds(wire.PrefillTimings, optional_seconds, optional_seconds,
                                              optional_seconds), stats, st.lists(logprobs, max_size=8).map(tuple)),
    wire.DecodeDoneBody: st.builds(wire.DecodeDoneBody, no_id | ids, st.none() | st.sampled_from(wire.FINISH_REASONS),
                                   st.lists(tokens, max_size=BOUNDS.max_tokens).map(tuple),
                                   st.none() | st.sampled_from(wire.PlanKind), st.builds(wire.Usage, counts, counts),
                                   st.builds(wire.DecodeTimings, optional_seconds, optional_seconds,
                                             optional_seconds), stats, st.lists(logprobs, max_size=8).map(tuple)),
}

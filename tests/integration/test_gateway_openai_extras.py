"""The OpenAI fields eval tools and best-of-n clients send, through the `openai` package and raw HTTP
in front of a real tiny-model cluster (1 prefill + 1 decode process, raw KV): logprobs (completions
and chat, streamed and not), echo with prompt logprobs (lm-evaluation-harness's loglikelihood
request), several prompts and `n` choices, penalties and logit_bias; and n streams that each
resume exactly when the decode node serving them is killed mid-stream."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.integration.gateway_helpers import TINY_NAME, gateway_cluster

pytestmark = pytest.mark.integration
PROMPT = "Once upon a time there was a little model"
GREEDY = {"model": TINY_NAME, "temperature": 0, "ignore_eos": True}


def post(served, body: dict, path: str = "/v1/completions") -> dict:
    response = httpx.post(served[1].url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_completion_logprobs_are_greedy_consistent(client):
    completion = client.completions.create(prompt=PROMPT, max_tokens=8, logprobs=3, **_extra(GREEDY))
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 8
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert chosen <= 0 and 3 <= len(top) <= 4 and chosen == pytest.approx(max(top.values()))
    assert logprobs.text_offset == sorted(logprobs.text_offset) and logprobs.text_offset[0] == 0


def test_echo_scores_the_prompt_as_lm_eval_asks(served):
    """lm-evaluation-harness's loglikelihood request: token ids, echo, logprobs 1, max_tokens 0.
    The continuation's logprob equals what a generation reported for the same token."""
    ids = list(range(20, 32))
    generated = post(served, {**GREEDY, "prompt": [ids], "max_tokens": 1, "logprobs": 1})["choices"][0]
    first_logprob = generated["logprobs"]["token_logprobs"][0]
    next_id = _token_id(served, ids, generated)
    scored = post(served, {**GREEDY, "prompt": [ids + [next_id]], "max_tokens": 0, "echo": True, "logprobs": 1})
    choice = scored["choices"][0]
    assert choice["logprobs"]["token_logprobs"][0] is None and choice["logprobs"]["top_logprobs"][0] is None
    assert len(choice["logprobs"]["tokens"]) == len(ids) + 1 and scored["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["token_logprobs"][-1] == pytest.approx(first_logprob, abs=0.05)
    assert all(lp <= 0 for lp in choice["logprobs"]["token_logprobs"][1:])


def _token_id(served, ids: list[int], choice: dict) -> int:
    """The id of the one token `choice` generated (the response carries its string, as OpenAI's)."""
    from nodes.engines.model_loader import TINY_VOCAB_SIZE
    from nodes.engines.tiny import tiny_tokenizer

    tokenizer = tiny_tokenizer(TINY_VOCAB_SIZE)
    by_text = {tokenizer.decode([t], skip_special_tokens=False): t for t in range(tokenizer.vocab_size)}
    return by_text[choice["logprobs"]["tokens"][0]]


def test_several_prompts_and_n_choices(served):
    body = {**GREEDY, "prompt": ["Hello", "Once upon"], "n": 2, "max_tokens": 5}
    response = post(served, body)
    choices = sorted(response["choices"], key=lambda c: c["index"])
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert choices[0]["text"] == choices[1]["text"] and choices[2]["text"] == choices[3]["text"]   # greedy
    assert response["usage"]["completion_tokens"] == 20
    seeded = post(served, {**body, "prompt": "Hello", "n": 4, "temperature": 1.0, "seed": 7, "max_tokens": 8})
    texts = [c["text"] for c in seeded["choices"]]
    assert len(set(texts)) > 1   # each choice samples with its own seed
    assert post(served, {**body, "prompt": "Hello", "n": 4, "temperature": 1.0, "seed": 7,
                         "max_tokens": 8})["choices"] == seeded["choices"]


def test_streamed_n_choices_carry_their_index_and_end_each(served):
    body = {**GREEDY, "prompt": PROMPT, "n": 3, "max_tokens": 6, "stream": True, "logprobs": 1}
    chunks = _stream(served[1].url + "/v1/completions", body)
    by_index: dict[int, str] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            by_index[choice["index"]] = by_index.get(choice["index"], "") + choice["text"]
    finals = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert sorted(f["index"] for f in finals) == [0, 1, 2] and len(set(by_index.values())) == 1
    assert all(c["choices"][0]["logprobs"]["token_logprobs"] for c in chunks
               if c["choices"] and not c["choices"][0]["finish_reason"])


def test_chat_logprobs(client):
    completion = client.chat.completions.create(messages=[{"role": "user", "content": "Hi!"}], max_tokens=6,
                                                logprobs=True, top_logprobs=2, **_extra(GREEDY))
    content = completion.choices[0].logprobs.content
    assert len(content) == 6 and all(len(entry.top_logprobs) == 2 for entry in content)
    assert all(entry.logprob == pytest.approx(entry.top_logprobs[0].logprob) for entry in content)
    streamed = list(client.chat.completions.create(messages=[{"role": "user", "content": "Hi!"}], max_tokens=6,
                                                   logprobs=True, stream=True, **_extra(GREEDY)))
    entries = [e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in content], abs=1e-6)


def test_logit_bias_and_penalties_steer_sampling(served):
    plain = post(served, {**GREEDY, "prompt": PROMPT, "max_tokens": 12})["choices"][0]["text"]
    forced = post(served, {**GREEDY, "prompt": PROMPT, "max_tokens": 4, "logit_bias": {"65": 100}})
    assert forced["choices"][0]["text"] == post(served, {**GREEDY, "prompt": [[65]], "max_tokens": 1,
                                                         "logit_bias": {"65": 100}})["choices"][0]["text"] * 4
    penalised = post(served, {**GREEDY, "prompt": PROMPT, "max_tokens": 12, "presence_penalty": 2.0,
                              "frequency_penalty": 2.0})["choices"][0]["text"]
    assert penalised != plain
    refused = httpx.post(served[1].url + "/v1/completions", json={**GREEDY, "prompt": PROMPT,
                                                                   "logit_bias": {"999999": 1}}, timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "logit_bias"


def test_n_streams_each_resume_exactly_after_their_decode_node_dies():
    slow = {"decode": ["--test-step-delay-ms", "20"]}
    body = {**GREEDY, "prompt": "Once upon a time", "max_tokens": 40, "n": 2, "logprobs": 1}
    with gateway_cluster(num_decode=2, extra_args=slow) as (cluster, gateway):
        url = f"{gateway.url}/v1/completions"
        expected = httpx.post(url, json={**body, "n": 1}, timeout=60).json()["choices"][0]["text"]
        chunks = _stream(url, {**body, "stream": True}, kill_after=6, kill=cluster.kill)
        texts: dict[int, str] = {}
        for chunk in chunks:
            for choice in chunk["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        assert texts == {0: expected, 1: expected}
        assert any(c["pdbus"]["failover"] for c in chunks if "pdbus" in c)


def _stream(url: str, body: dict, kill_after: int = 0, kill=None) -> list[dict]:
    chunks = []
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        assert response.status_code == 200
        serving = response.headers.get("X-Pdbus-Decode-Node")
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
                if kill is not None and len(chunks) == kill_after:
                    kill(serving)
    return chunks


def _extra(options: dict) -> dict:
    """The openai package takes vLLM's extensions (ignore_eos) in extra_body."""
    return {"model": options["model"], "temperature": options["temperature"],
            "extra_body": {"ignore_eos": options["ignore_eos"]}}


def streamed_choices(url: str, body: dict) -> list[dict]:
    """The choices a client joins from a completion stream: text and logprobs in chunk order."""
    choices: dict[int, dict] = {}
    for chunk in _stream(url + "/v1/completions", {**body, "stream": True}):
        for part in chunk["choices"]:
            choice = choices.setdefault(part["index"], {"text": "", "logprobs": {}})
            choice["text"] += part["text"]
            for key, values in (part["logprobs"] or {}).items():
                choice["logprobs"].setdefault(key, []).extend(values)
    return [choices[i] for i in sorted(choices)]


def test_a_streamed_echo_with_logprobs_equals_the_json_response(served):
    """The prompt comes first, with its logprobs (the prefill node's FINAL brings them), then each
    of the n choices' tokens: joined, each choice equals the JSON response's, offsets included."""
    body = {**GREEDY, "prompt": [list(range(40, 52))], "max_tokens": 4, "echo": True, "logprobs": 2, "n": 2}
    whole = post(served, body)["choices"]
    streamed = streamed_choices(served[1].url, body)
    assert [c["text"] for c in streamed] == [c["text"] for c in whole]
    for got, expected in zip(streamed, whole, strict=True):
        assert got["logprobs"]["tokens"] == expected["logprobs"]["tokens"]
        assert got["logprobs"]["text_offset"] == expected["logprobs"]["text_offset"]
        assert got["logprobs"]["token_logprobs"][0] is None
        assert got["logprobs"]["token_logprobs"][1:] == pytest.approx(expected["logprobs"]["token_logprobs"][1:],
                                                                      abs=1e-4)


def test_echo_and_logprobs_on_a_colocated_node_equal_the_disaggregated_ones(served):
    """With no prefill node the decode side prefills the prompt itself (a `local` plan) and still
    computes the prompt logprobs; greedy tokens and logprobs equal the 1P+1D cluster's, streamed
    too (the prompt's logprobs then come with the decode node's FINAL: the tokens wait for them)."""
    body = {**GREEDY, "prompt": [list(range(40, 52))], "max_tokens": 3, "echo": True, "logprobs": 2}
    disaggregated = post(served, body)["choices"][0]
    with gateway_cluster(num_prefill=0, num_decode=0, num_both=1) as colocated:
        local = post(colocated, body)["choices"][0]
        streamed = streamed_choices(colocated[1].url, body)[0]
    assert streamed["text"] == local["text"] and streamed["logprobs"]["tokens"] == local["logprobs"]["tokens"]
    assert streamed["logprobs"]["token_logprobs"][1:] == pytest.approx(local["logprobs"]["token_logprobs"][1:],
                                                                       abs=1e-4)
    assert local["text"] == disaggregated["text"]
    assert local["logprobs"]["tokens"] == disaggregated["logprobs"]["tokens"]
    assert local["logprobs"]["token_logprobs"][0] is None
    assert local["logprobs"]["token_logprobs"][1:] == pytest.approx(disaggregated["logprobs"]["token_logprobs"][1:],
                                                                    abs=0.05)


def test_n_choices_share_one_prefill_and_one_kv_transfer(served):
    """The cluster client's side of `n`: the later choices of a prompt name the first one's fork
    group and route key, plan `forked` on its decode node and never reach a prefill node."""
    import asyncio

    from nodes.engines.base import SamplingParams
    from tests.integration.cluster_helpers import client_for

    async def run() -> list:
        async with client_for(served[0]) as client:
            sampling = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
            generations = [client.generate(list(range(30, 60)), sampling, session_id=f"fork~{i}", fork_group="g1",
                                           route_key="fork~0") for i in range(3)]
            return await asyncio.gather(*(g.collect() for g in generations))

    leader, *followers = asyncio.run(run())
    assert leader.trace.plans == ["remote"] and len(leader.trace.prefill_node_ids) == 1
    for follower in followers:
        assert follower.trace.plans == ["forked"] and follower.trace.prefill_node_ids == []
        assert follower.token_ids == leader.token_ids


def test_best_of_returns_the_samples_of_highest_total_logprob(served):
    body = {"model": TINY_NAME, "prompt": "Hello", "max_tokens": 6, "temperature": 1.0, "seed": 3, "logprobs": 0}
    every = post(served, {**body, "n": 4})["choices"]
    totals = sorted((sum(c["logprobs"]["token_logprobs"]), c["text"]) for c in every)
    best = post(served, {**body, "n": 2, "best_of": 4})
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert [c["text"] for c in best["choices"]] == [text for _, text in reversed(totals[-2:])]
    assert best["usage"]["completion_tokens"] == 24   # every sample is generated
    refused = httpx.post(served[1].url + "/v1/completions", json={**body, "n": 2, "best_of": 4, "stream": True},
                         timeout=30)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "best_of"

"""harness/eval/pdbus_offline.py: lm-eval's `pdbus-offline` model on the tiny model, through lm-eval
itself and request by request. Needs lm-eval: `make install-eval`, then
`.venv-eval/bin/python -m pytest tests/harness/test_eval_offline.py` (skipped in .venv)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed in this venv: `make install-eval`, then "
                    "`.venv-eval/bin/python -m pytest tests/harness/test_eval_offline.py`")

from lm_eval.api.instance import Instance  # noqa: E402

from harness.eval.pdbus_offline import PdbusOffline  # noqa: E402


@pytest.fixture(scope="module")
def lm() -> PdbusOffline:
    return PdbusOffline(model="tiny")


def _ids(lm: PdbusOffline, text: str) -> list[int]:
    return lm.tok_encode(text)


def test_lm_eval_runs_both_tasks_and_the_chat_way(monkeypatch):
    import lm_eval
    import lm_eval.models  # noqa: F401

    from harness.eval import eval_runner

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    for task, args, chat, metric in (("pdbus_mc", {}, False, "acc,none"), ("pdbus_gen", {}, False, "exact_match,strict"),
                                     ("pdbus_gen", {"mode": "chat"}, True, "exact_match,flexible")):
        out = lm_eval.simple_evaluate(model="pdbus-offline", model_args={"model": "tiny", **args}, tasks=[task],
                                      task_manager=eval_runner._task_manager(), log_samples=True, limit=3,
                                      apply_chat_template=chat, fewshot_as_multiturn=chat)
        assert 0.0 <= out["results"][task][metric] <= 1.0
        assert {s["doc_id"] for s in out["samples"][task]} == {0, 1, 2}


def test_a_score_is_the_sum_of_the_continuations_prompt_logprobs_in_order(lm):
    from nodes.engines.base import PrefillRequest, SamplingParams

    context, continuation = _ids(lm, "Question: What is the capital of France?\nAnswer:"), _ids(lm, " Paris")
    [(score, _)] = lm._loglikelihood_tokens([(None, context, continuation)])
    [prefilled] = lm.engine.prefill([PrefillRequest("check", tuple(context + continuation),
                                                    SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))])
    expected = 0.0
    for entry in prefilled.prompt_logprobs[len(context):]:
        expected += entry.logprob
    assert score == expected and score < 0


def test_the_greedy_continuation_is_greedy_and_another_is_not(lm):
    from nodes.engines.base import SamplingParams

    context = _ids(lm, "Once upon a time")
    greedy_text = lm._prefill_then_decode(context, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    greedy = _ids(lm, "Once upon a time" + greedy_text)[len(context):]
    other = [(greedy[0] + 1) % 500, *greedy[1:]]
    results = lm._loglikelihood_tokens([(None, context, greedy), (None, context, other)])
    assert [is_greedy for _, is_greedy in results] == [True, False]
    assert results[0][0] > results[1][0]


def test_batching_prompts_moves_scores_by_rounding_at_most():
    # Not bit for bit in general: on the real model a float32 prefill pass's GEMMs round a row
    # differently with the number of rows in the pass (docs/EVAL.md, "Which dtype ...").
    requests = [(None, [1, 40 + i, 50 + i, 60], [70 + i, 80]) for i in range(6)]
    one = PdbusOffline(model="tiny", batch_size=1)._loglikelihood_tokens(requests)
    four = PdbusOffline(model="tiny", batch_size=4)._loglikelihood_tokens(requests)
    assert [greedy for _, greedy in one] == [greedy for _, greedy in four]
    assert [score for score, _ in one] == pytest.approx([score for score, _ in four], abs=1e-4)


def test_a_long_context_is_left_truncated_as_local_completions_does():
    lm = PdbusOffline(model="tiny", max_length=9)   # 8 tokens scored
    tokens, ctxlen = lm._scored_input(list(range(10, 20)), [30, 31])
    assert (tokens, ctxlen) == ([14, 15, 16, 17, 18, 19, 30, 31], 6)


def test_generation_through_prefill_then_decode_equals_the_colocated_engine(lm):
    from nodes.engines.base import DecodeRequest, SamplingParams

    prompt = _ids(lm, "The quick brown fox")
    sampling = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    disaggregated = lm._prefill_then_decode(prompt, sampling)
    assert lm.engine.add_request(DecodeRequest("colocated", tuple(prompt), sampling)).ok
    colocated = []
    while lm.engine.has_unfinished():
        colocated.extend(event.text for event in lm.engine.step())
    assert disaggregated == "".join(colocated) != ""


def test_generate_until_stops_at_the_stop_string_in_both_modes():
    gen_kwargs = {"until": ["e"], "max_gen_toks": 16, "do_sample": False, "temperature": 0.0}
    completions = PdbusOffline(model="tiny")
    chat = PdbusOffline(model="tiny", mode="chat")
    messages = chat.apply_chat_template([{"role": "user", "content": "Hello world!"}])
    assert json.loads(messages) == [{"role": "user", "content": "Hello world!"}]
    for lm, context in ((completions, "Hello world!"), (chat, messages)):
        request = Instance(request_type="generate_until", doc={}, arguments=(context, dict(gen_kwargs)), idx=0)
        [text] = lm.generate_until([request], disable_tqdm=True)
        assert "e" not in text

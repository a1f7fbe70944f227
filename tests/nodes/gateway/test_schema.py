"""Request validation (nodes/gateway/schema.py): what is accepted, refused and ignored, and the
context-length check, without sockets."""

import pytest

from nodes.engines.tiny import tiny_tokenizer
from nodes.gateway.api_errors import ApiError
from nodes.gateway.schema import parse_request, tokenize

MODEL = "m"


def parse(body, chat=False, **options):
    return parse_request(body, chat=chat, model_name=MODEL, max_tokens_limit=100, **options)


def refused(body, chat=False, status=400):
    with pytest.raises(ApiError) as info:
        parse(body, chat)
    assert info.value.status == status
    return info.value


def test_a_plain_completion_request_keeps_every_sampling_field():
    request = parse({"model": MODEL, "prompt": "hi", "max_tokens": 5, "temperature": 0, "top_p": 0.5, "top_k": 3,
                     "seed": 7, "stop": "\n", "stream": True, "stream_options": {"include_usage": True},
                     "ignore_eos": True, "user": "u", "session_id": "s"})
    assert (request.prompt, request.max_tokens, request.temperature, request.top_p, request.top_k) == ("hi", 5, 0, 0.5, 3)
    assert (request.seed, request.stop, request.stream, request.include_usage) == (7, ("\n",), True, True)
    assert request.ignore_eos and request.session_id == "s" and request.ignored_fields == ()


def test_unknown_fields_are_ignored_and_listed():
    assert parse({"model": MODEL, "prompt": "hi", "foo": 1, "priority": 0}).ignored_fields == ("foo", "priority")


def test_the_session_header_is_used_when_the_body_has_none():
    assert parse({"model": MODEL, "prompt": "hi"}, session_header="h").session_id == "h"
    assert parse({"model": MODEL, "prompt": "hi", "session_id": "b"}, session_header="h").session_id == "b"


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2, 3]]])
def test_token_id_prompts(prompt):
    assert parse({"model": MODEL, "prompt": prompt}).prompt_token_ids == (1, 2, 3)


def test_unknown_model_is_404_model_not_found():
    assert refused({"model": "gpt-4", "prompt": "hi"}, status=404).code == "model_not_found"


@pytest.mark.parametrize("body, param", [
    ({"prompt": "hi"}, "model"),
    ({"model": MODEL}, "prompt"),
    ({"model": MODEL, "prompt": ""}, "prompt"),
    ({"model": MODEL, "prompt": 5}, "prompt"),
    ({"model": MODEL, "prompt": ["a", 5]}, "prompt"),
    ({"model": MODEL, "prompt": ["a"] * 65}, "prompt"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": "5"}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": 101}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "temperature": 3}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "top_p": 0}, "top_p"),
    ({"model": MODEL, "prompt": "hi", "stream": "yes"}, "stream"),
    ({"model": MODEL, "prompt": "hi", "stop": [1]}, "stop"),
    ({"model": MODEL, "prompt": "hi", "n": 17}, "n"),
    ({"model": MODEL, "prompt": ["a"] * 8, "n": 9}, "n"),
    ({"model": MODEL, "prompt": "hi", "best_of": 17}, "best_of"),
    ({"model": MODEL, "prompt": "hi", "logprobs": 21}, "logprobs"),
    ({"model": MODEL, "prompt": "hi", "logprobs": True}, "logprobs"),
    ({"model": MODEL, "prompt": "hi", "presence_penalty": 2.5}, "presence_penalty"),
    ({"model": MODEL, "prompt": "hi", "frequency_penalty": "x"}, "frequency_penalty"),
    ({"model": MODEL, "prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {"a": 1}}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": {"5": 101}}, "5"),
    ({"model": MODEL, "prompt": "hi", "logit_bias": [1]}, "logit_bias"),
    ({"model": MODEL, "prompt": "hi", "suffix": "x"}, "suffix"),
    ({"model": MODEL, "prompt": "hi", "seed": 1.5}, "seed"),
    ({"model": MODEL, "prompt": "hi", "stream_options": 1}, "stream_options"),
])
def test_bad_fields_are_400_naming_the_field(body, param):
    assert refused(body).param == param


def test_a_body_that_is_not_an_object_is_400():
    refused(["model", "prompt"])


def test_chat_messages_accept_text_parts_and_refuse_bad_roles():
    request = parse({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                               {"type": "text", "text": "b"}]}],
                     "max_completion_tokens": 4}, chat=True)
    assert request.messages == ({"role": "user", "content": "ab"},) and request.max_tokens == 4
    for messages in ([], [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 3}],
                     [{"role": "user", "content": ""}], "hi"):
        assert refused({"model": MODEL, "messages": messages}, chat=True).param == "messages"


def test_tokenize_checks_the_context_and_defaults_max_tokens_to_what_fits():
    tokenizer = tiny_tokenizer(512)
    request = parse({"model": MODEL, "prompt": "Hello world"})
    ids, max_tokens = tokenize(request, tokenizer, max_model_len=64, default_max_tokens=256)
    assert ids == tuple(tokenizer.encode("Hello world")) and max_tokens == 64 - len(ids)
    with pytest.raises(ApiError) as info:
        tokenize(parse({"model": MODEL, "prompt": "Hello world", "max_tokens": 64}), tokenizer, 64, 16)
    assert info.value.code == "context_length_exceeded" and info.value.param == "max_tokens"
    with pytest.raises(ApiError) as info:
        tokenize(parse({"model": MODEL, "prompt": "Hello world " * 40}), tokenizer, 64, 16)
    assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
    with pytest.raises(ApiError):
        tokenize(parse({"model": MODEL, "prompt": [1, 99999]}), tokenizer, 64, 16)


def test_tokenize_a_chat_applies_the_template():
    tokenizer = tiny_tokenizer(512)
    request = parse({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, chat=True)
    ids, _ = tokenize(request, tokenizer, 2048, 16)
    assert tokenizer.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_openai_sampling_extras_are_read():
    api = parse({"model": MODEL, "prompt": ["a", [1, 2]], "n": 3, "logprobs": 5, "echo": True, "max_tokens": 0,
                 "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
                 "logit_bias": {"7": -100, "3": 2.5}})
    assert (api.num_prompts, api.n, api.logprobs, api.echo, api.max_tokens) == (2, 3, 5, True, 0)
    assert api.prompt_item(1).prompt_token_ids == (1, 2) and api.prompt_item(0).prompt == "a"
    assert (api.presence_penalty, api.frequency_penalty, api.repetition_penalty) == (0.5, -1.0, 1.2)
    assert api.logit_bias == ((3, 2.5), (7, -100.0))


def test_chat_logprobs_are_a_flag_with_top_logprobs():
    messages = [{"role": "user", "content": "hi"}]
    assert parse({"model": MODEL, "messages": messages, "logprobs": True, "top_logprobs": 3}, chat=True).logprobs == 3
    assert parse({"model": MODEL, "messages": messages, "logprobs": True}, chat=True).logprobs == 0
    assert parse({"model": MODEL, "messages": messages}, chat=True).logprobs is None
    assert refused({"model": MODEL, "messages": messages, "top_logprobs": 3}, chat=True).param == "top_logprobs"
    assert refused({"model": MODEL, "messages": messages, "echo": True}, chat=True).param == "echo"


def test_best_of_is_at_least_n_and_not_streamed():
    api = parse({"model": MODEL, "prompt": "hi", "n": 2, "best_of": 5})
    assert (api.n, api.best_of, api.samples) == (2, 5, 5)
    assert refused({"model": MODEL, "prompt": "hi", "n": 3, "best_of": 2}).param == "best_of"
    assert refused({"model": MODEL, "prompt": "hi", "best_of": 3, "stream": True}).param == "best_of"
    assert refused({"model": MODEL, "prompt": ["a"] * 16, "best_of": 5}).param == "n"

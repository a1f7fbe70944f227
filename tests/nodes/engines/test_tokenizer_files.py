"""Tokenizer folders (save / from_folder) and the sandboxed chat template."""

from __future__ import annotations

import json

import pytest

from nodes.engines.chat_template import ChatTemplate, ChatTemplateError
from nodes.engines.tokenizer import Tokenizer, TokenizerLoadError


def test_save_then_from_folder_round_trips(tmp_path, tiny_model):
    tok = tiny_model.tokenizer
    tok.save(tmp_path, model_max_length=2048)
    loaded = Tokenizer.from_folder(tmp_path)
    text = "Hello <|im_start|> 😀"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.bos_token_id == 1 and loaded.eos_token_ids == (2,)
    assert loaded.chat_template_source == tok.chat_template_source
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["eos_token"] == "<|im_end|>" and config["model_max_length"] == 2048


def test_from_folder_reads_added_token_dicts_and_chat_template_jinja(tmp_path, tiny_model):
    tiny_model.tokenizer.save(tmp_path, model_max_length=2048)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["eos_token"] = {"content": "<|endoftext|>", "special": True}
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    loaded = Tokenizer.from_folder(tmp_path)
    assert loaded.eos_token_ids == (0,)
    assert loaded.apply_chat_template([{"role": "user", "content": "hey"}]) == "hey!"


def test_from_folder_picks_the_default_of_named_templates(tmp_path, tiny_model):
    tiny_model.tokenizer.save(tmp_path, model_max_length=2048)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_folder(tmp_path).apply_chat_template([]) == "D"


def test_from_folder_errors_say_which_file(tmp_path, tiny_model):
    with pytest.raises(TokenizerLoadError, match="tokenizer.json is missing"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="does not parse"):
        Tokenizer.from_folder(tmp_path)
    tiny_model.tokenizer.save(tmp_path, model_max_length=2048)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(TokenizerLoadError, match="not valid JSON"):
        Tokenizer.from_folder(tmp_path)


def test_no_chat_template_is_a_clear_error(tiny_model):
    tok = Tokenizer(tiny_model.tokenizer.backend, bos_token_id=None, eos_token_ids=(), chat_template=None)
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_template_options_match_transformers():
    # trim_blocks / lstrip_blocks: block tags leave no newline or indentation behind.
    template = ChatTemplate("{% for m in messages %}\n  {% if m %}{{ m['content'] }}{% endif %}\n{% endfor %}")
    assert template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]) == "ab"
    assert ChatTemplate("{{ x | tojson }}").render([], x={"k": "<&>é"}) == '{"k": "<&>é"}'
    loop = "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}"
    assert ChatTemplate(loop).render([{"role": "a"}, {"role": "b"}]) == "a"
    assert ChatTemplate("{{ bos_token }}{{ add_generation_prompt }}").render([], bos_token="<s>") == "<s>True"


def test_template_raise_exception_and_bad_messages():
    template = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="user first"):
        template.render([{"role": "assistant", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="role"):
        template.render([{"content": "no role"}])


def test_template_is_sandboxed_and_bad_syntax_is_reported():
    with pytest.raises(ChatTemplateError, match="failed to render"):
        ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}").render([])
    with pytest.raises(ChatTemplateError, match="failed to render"):
        ChatTemplate("{% set _ = messages.append(1) %}").render([])  # immutable sandbox
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")

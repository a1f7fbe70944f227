"""Render a model's Jinja chat template the way Hugging Face transformers does, sandboxed.

Contract: `ChatTemplate(source).render(messages, add_generation_prompt=..., **special_tokens)`
returns the prompt text. Templates come with model files and are untrusted code, so they run in
jinja2's `ImmutableSandboxedEnvironment` with the same options and helpers transformers provides
(`trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, a `tojson` that
does not HTML-escape), so a template renders to the same text here as in transformers.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template does not compile, or refused the conversation (`raise_exception`)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson HTML-escapes '<', '>' and '&', which would change the prompt text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class ChatTemplate:
    def __init__(self, source: str) -> None:
        self.source = source
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, **extra: Any) -> str:
        for message in messages:
            if not isinstance(message, dict) or "role" not in message:
                raise ChatTemplateError(f"each chat message must be a dict with a 'role', got {message!r}")
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **extra)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed to render: {exc}") from exc

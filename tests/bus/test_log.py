"""Logging: lazy loggers follow configure_logging; JSON lines carry the bound ids."""

from __future__ import annotations

import json

import pytest

from bus.log import configure_logging, get_logger

EARLY = get_logger("early", node_id="n-1")  # created before configure_logging, as modules do


@pytest.fixture(autouse=True)
def default_configuration_after():
    """These tests reconfigure the process's logging: later tests (which capture info events)
    must find the default configuration again."""
    yield
    configure_logging()


def test_module_level_logger_follows_later_configuration_and_renders_json(capsys):
    configure_logging("json", "info")
    EARLY.info("hello", request_id="r-1")
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["event"] == "hello"
    assert line["component"] == "early" and line["node_id"] == "n-1" and line["request_id"] == "r-1"


def test_level_filter_drops_debug(capsys):
    configure_logging("json", "warning")
    get_logger("x").info("quiet")
    get_logger("x").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "loud" in err

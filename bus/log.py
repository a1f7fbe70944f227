"""Logging set-up shared by every pdbus process.

Contract: call `configure_logging()` once at process start; then `get_logger(name, **ctx)`
returns a structlog logger whose events carry `ctx` (node_id, request_id, session_id...).
Output is JSON when stderr is not a terminal (production, CI, log shippers) and readable
key=value lines in a terminal; `PDBUS_LOG_FORMAT=json|console` and `PDBUS_LOG_LEVEL` override.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
           "error": logging.ERROR}


def wants_json(fmt: str | None) -> bool:
    fmt = fmt or os.environ.get("PDBUS_LOG_FORMAT")
    if fmt in ("json", "console"):
        return fmt == "json"
    return not sys.stderr.isatty()


class _StderrLogger:
    """Writes each rendered line to whatever `sys.stderr` is *now* (test capture swaps it)."""

    def msg(self, message: str) -> None:
        # One write per line: print() writes text and newline separately, and two threads
        # logging at once then interleave two JSON objects on one line.
        sys.stderr.write(message + "\n")
        sys.stderr.flush()

    debug = info = warning = warn = error = critical = exception = fatal = log = msg


def _stderr_logger_factory(*_args: object) -> _StderrLogger:
    return _StderrLogger()


def configure_logging(fmt: str | None = None, level: str | None = None) -> None:
    """Configure structlog for this process (idempotent)."""
    level_name = (level or os.environ.get("PDBUS_LOG_LEVEL") or "info").lower()
    renderer = (structlog.processors.JSONRenderer() if wants_json(fmt)
                else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level_name, logging.INFO)),
        logger_factory=_stderr_logger_factory,
        cache_logger_on_first_use=False,
    )


def get_logger(name: str, **context: object) -> structlog.typing.FilteringBoundLogger:
    """A logger bound to `name` (the component) and any context ids given.

    The proxy resolves lazily, so a module-level logger still follows a later `configure_logging()`.
    """
    return structlog.get_logger(component=name, **context)

"""The `pdbus` console script: help, unknown commands, lazy imports."""

from __future__ import annotations

import subprocess
import sys

from nodes.cli import SUBCOMMANDS, main


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_every_subcommand_module_exists_and_has_the_contract():
    import importlib

    for module_name, _ in SUBCOMMANDS.values():
        module = importlib.import_module(module_name)
        assert callable(module.add_arguments) and callable(module.main)


def test_broker_command_does_not_import_torch():
    code = "import sys; from nodes.cli import build_parser; build_parser('broker'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

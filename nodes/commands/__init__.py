"""`pdbus` subcommands, one module each: `pdbus <name>` is `nodes/commands/<name>_cmd.py` (the
suffix keeps a command's module apart from what it runs: `broker_cmd` vs `bus/broker.py`).

Contract: a module here defines `add_arguments(parser: argparse.ArgumentParser) -> None` and
`main(args: argparse.Namespace) -> int` (the process exit code). `nodes.cli` imports a module
only when its subcommand runs, so `pdbus broker` never imports torch.
"""

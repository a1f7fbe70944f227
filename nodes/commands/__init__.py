"""`pdbus` subcommands, one module each.

Contract: a module here defines `add_arguments(parser: argparse.ArgumentParser) -> None` and
`main(args: argparse.Namespace) -> int` (the process exit code). `nodes.cli` imports a module
only when its subcommand runs, so `pdbus broker` never imports torch.
"""

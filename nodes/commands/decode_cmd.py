"""`pdbus decode`: run a decode node (see nodes/decode_node.py for what it serves and docs/CLUSTER.md for the flow).

Reads [broker], [heartbeat], [engine], [prefill], [decode], [kv], [scheduler] from the config;
flags override them. SIGINT/SIGTERM stop it cleanly (DISCONNECT to the broker).
"""

from __future__ import annotations

import argparse

from nodes.node_settings import add_node_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_node_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from nodes.node_main import serve_role

    return serve_role(args, "decode")

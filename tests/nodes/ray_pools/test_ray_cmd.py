"""`pdbus ray` without Ray installed (one line, exit 2), its flags, and the rule that nothing outside
nodes/ray_pools/ imports Ray."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

from nodes.cli import build_parser
from tests.conftest import REPO_ROOT

BLOCK_RAY = textwrap.dedent("""
    import importlib.abc, sys
    class NoRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, NoRay())
    from nodes.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_without_ray_every_action_says_how_to_install_it_and_exits_2():
    for action in ("up", "status", "down"):
        done = subprocess.run([sys.executable, "-c", BLOCK_RAY, "ray", action], capture_output=True, text=True,
                              cwd=REPO_ROOT, timeout=60)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip() == "pdbus ray: Ray is not installed: pip install 'pdbus[ray]' (or `make install-ray`)"


def test_flags_before_or_after_the_action():
    args = build_parser("ray").parse_args(["ray", "--config", "a.toml", "up", "--prefill", "2", "--address",
                                           "127.0.0.1:6379"])
    assert (args.action, args.config, args.prefill, args.address, args.planner) == ("up", "a.toml", 2,
                                                                                     "127.0.0.1:6379", False)
    args = build_parser("ray").parse_args(["ray", "status", "--json", "--config", "b.toml", "--log-level", "debug"])
    assert (args.action, args.json, args.config, args.log_level, args.address) == ("status", True, "b.toml",
                                                                                   "debug", None)
    assert build_parser("ray").parse_args(["ray", "down", "--grace-s", "5"]).grace_s == 5.0


def test_only_the_ray_package_imports_ray():
    importing = re.compile(r"^\s*(import ray\b|from ray\b)", re.MULTILINE)
    offenders = [str(path.relative_to(REPO_ROOT)) for top in ("bus", "scheduler", "nodes", "harness")
                 for path in (REPO_ROOT / top).rglob("*.py")
                 if importing.search(path.read_text()) and "ray_pools" not in path.parts]
    assert offenders == []


def test_the_command_and_the_plan_load_without_ray():
    code = ("import sys; import nodes.cli, nodes.commands.ray_cmd, nodes.ray_pools.pool_plan, "
            "nodes.ray_pools.component_runner, nodes.ray_pools.status_table; print('ray' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert done.stdout.strip() == "False"

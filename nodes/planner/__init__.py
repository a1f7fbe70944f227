"""The planner's shell (issue #42, "Elastic pools"): sizes the prefill and decode pools from what
the broker reports, through the core in `scheduler/planner.py`.

- `planner_shell.PlannerShell`: one round every interval: broker stats -> decision -> action, each
  logged (`planner_decision`, `planner_wanted`, `planner_action_failed`).
- `actuator`: the `Actuator` seam (`can_start`, `start_node`, `stop_node`), the bus commands
  (`drain`, `switch_role`) and `BusOnlyActuator` (starts nothing).
- `launcher_actuator.LauncherActuator`: starts and drains children of `pdbus cluster --planner`.
- `planner_metrics`: the Prometheus text on `--metrics-port`.
- `planner_run`: settings (`[planner]`), the `control` endpoint, the loop, the launcher's thread.
The command is `nodes/commands/planner_cmd.py` (`pdbus planner`); docs/CLUSTER.md "The planner".
"""

"""`pdbus ray`: the cluster's processes as Ray actors (issue #42; docs/CLUSTER.md "On a Ray cluster").

The only package that imports Ray, and nothing outside it imports it (`pip install pdbus[ray]`,
`make install-ray`). Its modules, by layer:
- `pool_plan` (plain data, no Ray): what to place — one `ComponentSpec` per broker, node and
  gateway, with its argv, resource request and readiness event; `[ray]` settings (`RayOptions`).
- `supervision` (pure): one child process's lifecycle — restart with back-off after a non-zero
  exit, stay down after exit 0 (drained or stopped), follow a node's role switches.
- `component_runner` (no Ray): runs and keeps one component's process; the body of the actor.
- `placement` (Ray): connecting on loopback, a local head, the actors themselves and where they run.
- `pools` (Ray): `up`, `status`, `down`; `status_table` (pure) renders what `status` gathered.
- `ray_actuator` (Ray): the planner's `Actuator` (nodes/planner/actuator.py) on Ray.
"""

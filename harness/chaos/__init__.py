"""The chaos and failover harness (`pdbus chaos`, `make chaos`): a real local cluster on loopback,
a seeded greedy workload streamed through the gateway, faults injected while it streams, and
checks that no accepted request is lost or altered.

Modules: `chaos_runner` (the flow and the verdicts), `scenarios` (what each fault does, how the cluster
is repaired, what each proves; the client-side ones in `client_scenarios`, hostile-peer in
`hostile_scenario`), `chaos_cluster` (ChaosCluster: ClusterProcs with hooked nodes, the
gateway and the partition proxy), `hooked_node` (the data-plane fault hooks, armed at run time),
`proxy` (the partition), `drivers` (sse / ws / bus clients), `stalled` (a client that stops
reading), `passes` (one workload pass with its fault), `chaos_workload`, `checks`, `chaos_report`.
"""

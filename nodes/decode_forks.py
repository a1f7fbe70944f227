"""`n` choices of one prompt from one KV transfer: which waiting requests on a decode node follow
which leader. Plain data: no engine, no bus.

Contract (`ForkGroups`, one per decode node): a client sends the n choices of a prompt as n decode
requests naming one `fork_group`, the first (the leader) before the others, all routed by the
leader's key. The leader plans `remote` as ever (`lead(group, request_id)` once it waits for its
KV). A later request of the group that finds its leader here, still waiting, with the same prompt
and salt and no held prefix, is a follower: plan `forked` (no prefill of its own, nothing sent to
it), `follow(leader_id, request_id)`. When the leader's KV arrives the node starts the leader, then
each of `end(leader_id)` (its followers; the group closes) from the same KV tensor: the engine computes the prompt's last
token again for each (its logits are needed) and samples with the follower's own seed. A leader
that ends before its KV arrived (`end(leader_id)`) returns its followers, which the node fails
with `kv_failed`: the client retries each, which then plans on its own. A resume (delivered
tokens) never forks, and `drop(request_id)` forgets a follower that ended on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class _Group:
    leader_id: str
    prompt: tuple[int, ...]
    salt: str
    followers: list[str] = field(default_factory=list)


class ForkGroups:
    def __init__(self) -> None:
        self._groups: dict[str, _Group] = {}    # fork_group -> its waiting leader
        self._led: dict[str, str] = {}          # leader request id -> fork_group

    def lead(self, group: str, request_id: str, prompt: tuple[int, ...], salt: str) -> None:
        if group and group not in self._groups:
            self._groups[group] = _Group(request_id, prompt, salt)
            self._led[request_id] = group

    def leader_for(self, group: str, prompt: tuple[int, ...], salt: str) -> str | None:
        """The waiting leader a new request of `group` may fork from (same prompt and salt)."""
        found = self._groups.get(group) if group else None
        if found is None or found.prompt != prompt or found.salt != salt:
            return None
        return found.leader_id

    def follow(self, leader_id: str, request_id: str) -> None:
        self._groups[self._led[leader_id]].followers.append(request_id)

    def end(self, leader_id: str) -> list[str]:
        """The leader started or ended: its group closes; returns its followers."""
        group = self._led.pop(leader_id, None)
        return [] if group is None else self._groups.pop(group).followers

    def drop(self, request_id: str) -> None:
        for group in self._groups.values():
            if request_id in group.followers:
                group.followers.remove(request_id)
                return

    def __len__(self) -> int:
        return len(self._groups)

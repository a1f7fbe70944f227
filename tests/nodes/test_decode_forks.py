"""n choices from one KV transfer on a decode node (nodes/decode_forks.py, DecodeWork): followers
of a waiting leader plan `forked`, start from the leader's KV when it lands (greedy: the leader's
text; seeded: their own), and fail over (`kv_failed`) when their leader ends without KV; a resume,
another prompt or a leader already running never forks."""

from __future__ import annotations

import time

from bus.messages import Cancel
from nodes import wire
from nodes.decode_forks import ForkGroups
from nodes.engines.base import SamplingParams
from tests.nodes.test_decode_node import GREEDY, PROMPT, arrive, make_work, request, run_until_idle, streamed


def test_groups_match_prompt_and_salt_and_close_once():
    groups = ForkGroups()
    groups.lead("g", "r0", (1, 2), "")
    assert groups.leader_for("g", (1, 2), "") == "r0"
    assert groups.leader_for("g", (1, 3), "") is None and groups.leader_for("g", (1, 2), "t") is None
    assert groups.leader_for("", (1, 2), "") is None and groups.leader_for("h", (1, 2), "") is None
    groups.follow("r0", "r1")
    groups.follow("r0", "r2")
    groups.drop("r2")
    assert groups.end("r0") == ["r1"] and groups.end("r0") == [] and len(groups) == 0


def test_followers_plan_forked_and_decode_from_the_leaders_kv(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    seeded = wire.to_wire(SamplingParams(temperature=1.0, seed=11, max_tokens=6, ignore_eos=True))
    work.on_message(request("r0", fork_group="g"))
    work.on_message(request("r1", fork_group="g"))
    work.on_message(request("r2", fork_group="g", sampling=seeded))
    assert [endpoint.of("partial", r)[0]["plan"] for r in ("r0", "r1", "r2")] == ["remote", "forked", "forked"]
    assert work.capacity()["num_running"] == 3   # each holds its KV blocks while it waits
    arrive(work, endpoint, "r0", PROMPT)
    assert all(work.jobs[r].running for r in ("r0", "r1", "r2"))
    run_until_idle(work)
    leader, greedy, sampled = (streamed(endpoint, r) for r in ("r0", "r1", "r2"))
    # The leader's first token came from the prefill node; a follower computes its own first token.
    assert greedy[1:] == leader and len(sampled) == 6
    assert work.counters["plan.forked"] == 2


def test_a_leader_gone_before_its_kv_fails_its_followers_over(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r0", fork_group="g"))
    work.on_message(request("r1", fork_group="g"))
    work.on_message(Cancel("r0"))
    assert endpoint.of("error", "r1")[0]["code"] == "kv_failed" and "r1" not in work.jobs
    assert work.capacity()["num_running"] == 0


def test_what_never_forks(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r0", fork_group="g"))
    work.on_message(request("other", fork_group="g", prompt_token_ids=PROMPT[::-1]))
    work.on_message(request("resume", fork_group="g", resume={"num_delivered": 2}))
    assert [endpoint.of("partial", r)[0]["plan"] for r in ("other", "resume")] == ["remote", "remote"]
    arrive(work, endpoint, "r0", PROMPT)
    work.on_message(request("late", fork_group="g"))   # the leader already runs: its KV is in its slot
    assert endpoint.of("partial", "late")[0]["plan"] == "remote"
    work.work(time.monotonic())


def test_a_follower_cancelled_while_waiting_is_forgotten(kv_thread):
    work, endpoint, _ = make_work(kv_thread)
    work.on_message(request("r0", fork_group="g", sampling=GREEDY))
    work.on_message(request("r1", fork_group="g"))
    work.on_message(Cancel("r1"))
    arrive(work, endpoint, "r0", PROMPT)
    run_until_idle(work)
    assert len(streamed(endpoint, "r0")) == 5 and not endpoint.of("final", "r1")

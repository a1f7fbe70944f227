"""The fuzz corpus's cluster cases, run in a child process by test_corpus.py: each prints one JSON
line with its outcome. In a child because the ClusterClient failures they replay print asyncio's
"Task exception was never retrieved" tracebacks, and on CPython 3.11.7 formatting those can leave
the `ast` module's recursion counter off, after which pytest cannot render a failure
("AST constructor recursion depth mismatch", an INTERNALERROR that would end the whole run).

    python -m tests.harness.fuzz.corpus_cases nan_kv
    python -m tests.harness.fuzz.corpus_cases wrong_reply prefill_final|prefill_token|decode_plan '<JSON body>'
"""

from __future__ import annotations

import asyncio
import json
import sys

import zmq.asyncio

from bus import codec
from bus.constants import Command
from harness.cluster_procs import ClusterProcs
from harness.fuzz import forged_frames
from harness.fuzz.bus_peer import Counts, Session, reply_frames
from harness.fuzz.hostile_node import forge
from harness.fuzz.kv_peer import KvPeer
from nodes.cluster import ClusterClient, ClusterError
from nodes.engines.base import SamplingParams

NAN, GOOD_PROMPT, BAD_PROMPT = b"\x00\x00\xc0\x7f", [1, 2, 3, 4, 5, 6], [9, 9, 9, 9, 9, 9]


async def hostile_prefill(broker: str, answer) -> None:
    """A registered prefill node that answers every prefill REQUEST with `answer(session, request)`."""
    context = zmq.asyncio.Context()
    session = Session(context, broker, "prefill", "a-hostile-prefill", Counts(),
                      capacity={"max_batch_tokens": 2048, "queued_tokens": 0})
    try:
        assert await session.start()
        while True:
            request = await session.requests.get()
            await answer(session, request, context)
    finally:
        await session.close()
        context.destroy(linger=0)


async def collect(generation, tokens: list, started: asyncio.Event | None = None) -> None:
    async for token in generation:
        tokens.append(token)
        if started is not None and len(tokens) >= 3:
            started.set()


def nan_kv() -> dict:
    """A healthy stream decoding while a forger's NaN KV joins the same decode node's batch."""
    async def answer(session, request, context):
        body = request.body
        fill = NAN if body["prompt_token_ids"] == BAD_PROMPT else b"\x00\x00\x00\x00"
        kv = KvPeer(context, body["data_endpoint"], Counts()).start()
        await forge(session, request, body, kv, forged_frames.Known(geometry=forged_frames.tiny_geometry()), fill, 5, Counts())
        await kv.close()

    async def scenario(cluster) -> dict:
        hostile = asyncio.create_task(hostile_prefill(cluster.broker_endpoint, answer))
        await asyncio.sleep(0.5)
        sampling = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
        async with ClusterClient(cluster.broker_endpoint, max_retries=0, stall_timeout_s=20.0) as client:
            good, bad, started = client.generate(GOOD_PROMPT, sampling), client.generate(BAD_PROMPT, sampling), asyncio.Event()
            tokens: list = []
            good_task = asyncio.create_task(collect(good, tokens, started))
            await asyncio.wait_for(started.wait(), 20)
            await asyncio.gather(collect(bad, []), return_exceptions=True)   # the forger's own request may fail
            try:
                await asyncio.wait_for(good_task, 30)
                outcome = {"good": "ok", "failures": good.result.trace.failures}
            except ClusterError as exc:
                outcome = {"good": exc.code, "message": exc.message, "failures": exc.trace.failures}
        hostile.cancel()
        return {**outcome, "num_tokens": len(tokens)}

    with ClusterProcs(num_prefill=0, num_decode=1, settings={"decode": {"num_kv_blocks": 64}},
                      extra_args={"decode": ["--test-step-delay-ms", "20"]}) as cluster:
        outcome = asyncio.run(scenario(cluster))
        outcome["decode_alive"] = cluster.nodes["decode-0"].alive
        outcome["engine_step_failed"] = len(cluster.nodes["decode-0"].find("engine_step_failed"))
    return outcome


def wrong_reply(where: str, wrong) -> dict:
    """A decode node that plans remote and a prefill node that answers with a token and a done
    FINAL, one of the three bodies (`where`: decode_plan, prefill_token, prefill_final) `wrong`."""
    def body(name: str, good: dict):
        return wrong if where == name else good

    async def answer(session, request, context):
        token = body("prefill_token", {"type": "token", "index": 0, "token_id": 5, "text": "x"})
        await session.send("PARTIAL", reply_frames(Command.PARTIAL, request.request_id, 0, forged_frames.pack(token)))
        final = body("prefill_final", {"type": "done", "node_id": "a-hostile-prefill", "token": [0, 5, "x"],
                                       "transfer": {}, "timings": {}, "stats": {}})
        await session.send("FINAL", reply_frames(Command.FINAL, request.request_id, 1, forged_frames.pack(final)))

    async def fake_decode(broker: str) -> None:
        context = zmq.asyncio.Context()
        session = Session(context, broker, "decode", "a-fake-decode", Counts(),
                          capacity={"kv_blocks_total": 64, "kv_blocks_free": 64, "max_running": 4})
        assert await session.start()
        try:
            while True:
                request = await session.requests.get()
                plan = body("decode_plan", {"type": "plan", "plan": "remote", "node_id": "a-fake-decode",
                                            "data_endpoint": "tcp://127.0.0.1:9", "transfer_id": "t-" + request.request_id})
                await session.send("PARTIAL", [codec.HEADERS[Command.PARTIAL], request.request_id.encode(),
                                               codec.encode_seq(0), forged_frames.pack(plan)])
        finally:
            await session.close()
            context.destroy(linger=0)

    async def scenario(cluster) -> dict:
        tasks = [asyncio.create_task(fake_decode(cluster.broker_endpoint)),
                 asyncio.create_task(hostile_prefill(cluster.broker_endpoint, answer))]
        await asyncio.sleep(0.5)
        sampling = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        async with ClusterClient(cluster.broker_endpoint, max_retries=1, stall_timeout_s=3.0,
                                 plan_timeout_s=5.0) as client:
            try:
                await asyncio.wait_for(collect(client.generate([1, 2, 3], sampling), []), 30)
                outcome = {"code": "ok"}
            except ClusterError as exc:
                outcome = {"code": exc.code, "message": exc.message}
        for task in tasks:
            task.cancel()
        return outcome

    with ClusterProcs(num_prefill=0, num_decode=0) as cluster:
        return asyncio.run(scenario(cluster))


if __name__ == "__main__":
    case = sys.argv[1]
    result = nan_kv() if case == "nan_kv" else wrong_reply(sys.argv[2], json.loads(sys.argv[3]))
    print("RESULT " + json.dumps(result), flush=True)

"""The SSE timeline, sans-I/O: which chunks set TTFT and ITL, usage, errors, the pdbus object."""

from harness.bench.serve.load_generator import RequestResult, apply_chunk, request_body
from harness.bench.serve.serve_workload import RequestSpec


def chunk(text="", **extra):
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}], **extra}


def test_first_text_chunk_sets_ttft_and_later_ones_the_gaps():
    result, state = RequestResult("chat", 3, 3), {}
    for now, item in ((10.5, chunk("a")), (10.6, chunk("")), (10.7, chunk("b")), (11.0, chunk("c")),
                      (11.0, {"choices": [], "usage": {"completion_tokens": 3}}),
                      (11.0, chunk("", pdbus={"decode_node": "decode-0"}))):
        apply_chunk(result, item, sent_at=10.0, now=now, state=state)
    assert result.ttft == 0.5
    assert [round(g, 3) for g in result.itl] == [0.2, 0.3]      # the empty chunk is no token
    assert result.output_tokens == 3 and result.pdbus == {"decode_node": "decode-0"}


def test_an_error_chunk_is_recorded():
    result = RequestResult("chat", 3, 3)
    apply_chunk(result, {"error": {"message": "overloaded"}}, 0.0, 1.0, {})
    assert result.error == "overloaded"


def test_request_body_is_what_vllm_bench_serve_sends():
    body = request_body("m", RequestSpec("chat", (21, 22), 5))
    assert body == {"model": "m", "prompt": [21, 22], "max_tokens": 5, "temperature": 0.0, "ignore_eos": True,
                    "stream": True, "stream_options": {"include_usage": True}}


def test_a_session_id_goes_out_only_when_the_spec_has_one():
    body = request_body("m", RequestSpec("chat", (21, 22), 5, session_id="conv-1"))
    assert body["session_id"] == "conv-1"


def test_a_turn_is_sent_only_after_the_turn_it_follows_ended():
    import asyncio
    import json

    from aiohttp import web

    from harness.bench.serve.load_generator import run_load

    order: list[tuple[str, int]] = []

    async def completions(request):
        body = await request.json()
        order.append(("start", len(body["prompt"])))
        await asyncio.sleep(0.05 if len(body["prompt"]) == 1 else 0.0)
        order.append(("end", len(body["prompt"])))
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(f"data: {json.dumps(chunk('x'))}\n\ndata: [DONE]\n\n".encode())
        return response

    async def main():
        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        specs = [RequestSpec("chat", (21,), 1, "c"), RequestSpec("chat", (21, 22), 1, "c", after=0)]
        try:
            results, _ = await run_load(f"http://127.0.0.1:{port}", "m", specs, offsets=[0.0, 0.0])
        finally:
            await runner.cleanup()
        return results

    results = asyncio.run(main())
    assert all(r.success for r in results)
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]

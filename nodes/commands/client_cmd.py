"""`pdbus client`: stream a completion or a chat over the gateway's WebSocket (`/v1/stream`).

Contract: `add_arguments(parser)` and `main(args) -> int`.
- `pdbus client --prompt TEXT`: one completion; tokens go to stdout as they arrive.
- `pdbus client --chat --prompt TEXT`: one chat turn (the model's chat template), then exit.
- `pdbus client --chat`: an interactive multi-turn chat on stdin (empty line, `exit` or EOF
  ends it); every turn sends the whole conversation with one session id, so the decode node
  reuses the conversation's KV cache.
After each answer one summary line goes to stderr: tokens, time to first token, tokens/s, finish
reason, the nodes that served it, the KV mode and any failover. The gateway URL defaults to
`[gateway] host:port`; `--api-key` or `$PDBUS_API_KEY` when the gateway wants one. Exit 1 when
the gateway cannot be reached or answers an error (printed on one line), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid

from nodes.config_file import load_settings, section


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt", help="the prompt (with --chat: the first user turn, then exit)")
    parser.add_argument("--chat", action="store_true", help="chat: the model's chat template, one session")
    parser.add_argument("--url", help="gateway base URL (default: http://[gateway] host:port)")
    parser.add_argument("--api-key", default=os.environ.get("PDBUS_API_KEY"), help="Bearer key ($PDBUS_API_KEY)")
    parser.add_argument("--model", help="model name (default: [gateway] model_name)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--session", help="session id (default: a new one per run)")
    parser.add_argument("--system", help="with --chat: a system message")


def _url(args: argparse.Namespace, gateway: dict) -> str:
    base = args.url or f"http://{gateway.get('host', '127.0.0.1')}:{gateway.get('port', 8000)}"
    return base.rstrip("/").replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/v1/stream"


def summary(done: dict) -> str:
    usage, timings, info = done.get("usage", {}), done.get("timings", {}), done.get("pdbus") or {}
    ttft = timings.get("ttft_s")
    rate = timings.get("tokens_per_s")
    return (f"[{usage.get('prompt_tokens', 0)} prompt tokens, {usage.get('completion_tokens', 0)} generated, "
            f"TTFT {ttft * 1e3:.0f} ms, " if ttft is not None else "[no tokens, ") + (
            f"{rate:.1f} tok/s, " if rate else "") + (
            f"finish: {done.get('finish_reason')}; prefill {info.get('prefill_node') or '-'}, "
            f"decode {info.get('decode_node') or '-'}, kv {info.get('kv_mode', '-')}, "
            f"failover {'yes' if info.get('failover') else 'no'}]")


async def _turn(ws, request: dict) -> tuple[str, dict]:
    """Send one request, print its tokens; (text, the done message). RuntimeError on an error."""
    await ws.send_str(json.dumps(request))
    pieces: list[str] = []
    async for message in ws:
        data = json.loads(message.data)
        if data.get("type") == "token":
            pieces.append(data["text"])
            sys.stdout.write(data["text"])
            sys.stdout.flush()
        elif data.get("type") == "done":
            print()
            return "".join(pieces), data
        elif data.get("type") == "error":
            error = data.get("error", {})
            raise RuntimeError(f"{error.get('status', '')} {error.get('message', data)}")
    raise RuntimeError(f"the gateway closed the connection ({ws.close_code})")


async def _run(args: argparse.Namespace, url: str, model: str) -> int:
    import aiohttp

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    base = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature,
            "session_id": args.session or uuid.uuid4().hex}
    if args.seed is not None:
        base["seed"] = args.seed
    async with aiohttp.ClientSession() as session, session.ws_connect(url, headers=headers) as ws:
        if not args.chat:
            _, done = await _turn(ws, {**base, "prompt": args.prompt})
            print(summary(done), file=sys.stderr)
            return 0
        messages = [{"role": "system", "content": args.system}] if args.system else []
        interactive = args.prompt is None
        while True:
            text = args.prompt if not interactive else await asyncio.to_thread(_read_turn)
            if not text:
                return 0
            messages.append({"role": "user", "content": text})
            answer, done = await _turn(ws, {**base, "messages": messages})
            messages.append({"role": "assistant", "content": answer})
            print(summary(done), file=sys.stderr)
            if not interactive:
                return 0


def _read_turn() -> str | None:
    try:
        line = input("you> ")
    except EOFError:
        return None
    return None if line.strip() in ("", "exit", "quit") else line


def main(args: argparse.Namespace) -> int:
    import aiohttp

    if not args.chat and not args.prompt:
        print("pdbus client: give --prompt TEXT, or --chat for an interactive chat", file=sys.stderr)
        return 2
    settings = load_settings(args.config)
    gateway = section(settings, "gateway")
    url = _url(args, gateway)
    started = time.perf_counter()
    try:
        return asyncio.run(_run(args, url, args.model or gateway.get("model_name", "SmolLM2-135M-Instruct")))
    except (aiohttp.ClientError, OSError) as exc:
        print(f"\npdbus client: cannot stream from {url}: {exc}", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"\npdbus client: {exc} (after {time.perf_counter() - started:.1f}s)", file=sys.stderr)
        return 1

"""A real WebSocket client (the pinned `websockets`) that tests/ws.rs drives line by line.

    ws_relay.py --uds SOCK --path /v1/shell/ws?session_id=S [--header "Name: value"]...
    ws_relay.py --url ws://127.0.0.1:PORT/v1/shell/ws [--protocol P]... [--max-queue N]

It connects, then prints one JSON line per thing that happens and reads one JSON line
per thing to do from stdin, until stdin closes (then it closes the WebSocket and exits).

Printed: {"event": "open", "subprotocol": P} | {"event": "refused", "status": N} |
{"event": "message", "data": MSG} (a text message, parsed as JSON) | {"event": "pong",
"data": TEXT} (the answer to a ping it sent) | {"event": "closed", "code": N, "reason": R}.

Read: {"op": "send", "msg": MSG} | {"op": "send_text", "text": T} | {"op": "send_binary",
"data": T} | {"op": "ping", "data": T} | {"op": "stop_reading"} | {"op":
"resume_reading"} | {"op": "close", "code": N}.
"""

import argparse
import asyncio
import json
import sys

import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def read(ws):
    try:
        async for text in ws:
            try:
                data = json.loads(text)
            except ValueError:
                data = text
            say({"event": "message", "data": data})
    except ConnectionClosed:
        pass
    say({"event": "closed", "code": ws.close_code, "reason": ws.close_reason})


async def commands(ws):
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    task = asyncio.create_task(read(ws))
    while True:
        line = await reader.readline()
        if not line:
            break
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "send":
                await ws.send(json.dumps(cmd["msg"]))
            elif op == "send_text":
                await ws.send(cmd["text"])
            elif op == "send_binary":
                await ws.send(cmd["data"].encode())
            elif op == "ping":
                waiter = await ws.ping(cmd["data"])
                await asyncio.wait_for(waiter, 10)
                say({"event": "pong", "data": cmd["data"]})
            elif op == "stop_reading":
                task.cancel()
            elif op == "resume_reading":
                task = asyncio.create_task(read(ws))
            elif op == "close":
                await ws.close(cmd.get("code", 1000))
        except ConnectionClosed:
            pass
    await ws.close()
    try:
        await asyncio.wait_for(task, 5)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        pass


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--uds")
    p.add_argument("--path", default="/v1/shell/ws")
    p.add_argument("--url")
    p.add_argument("--protocol", action="append", default=[])
    p.add_argument("--header", action="append", default=[])
    # A small queue, so a client that stops reading is one the daemon sees stop.
    p.add_argument("--max-queue", type=int, default=4)
    a = p.parse_args()
    headers = [tuple(h.split(": ", 1)) for h in a.header]
    kwargs = dict(
        subprotocols=a.protocol or None,
        additional_headers=headers,
        max_queue=a.max_queue,
        ping_interval=None,
        open_timeout=20,
        max_size=2**24,
    )
    try:
        if a.uds:
            ws = await websockets.unix_connect(a.uds, "ws://localhost" + a.path, **kwargs)
        else:
            ws = await websockets.connect(a.url, **kwargs)
    except InvalidStatus as e:
        say({"event": "refused", "status": e.response.status_code})
        return
    say({"event": "open", "subprotocol": ws.subprotocol})
    await commands(ws)


asyncio.run(main())

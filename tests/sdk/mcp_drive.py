"""Drives `execctl mcp` with the official MCP Python SDK (PyPI `mcp`), unmodified, over
stdio, as an agent would (PROTOCOL 17).

Run by tests/mcp.rs inside the tests' virtualenv:

    mcp_drive.py SCENARIO --server PROGRAM [ARG...] [--dir DIR]

The server is started by the SDK's own `stdio_client`, with the SDK's default
environment (HOME, LOGNAME, PATH, SHELL, TERM, USER: no XDG_RUNTIME_DIR). Each scenario
checks what it can see itself and prints `RESULT {json}` lines for the Rust test to check
what only the daemon can see (which commands still run, what the approver heard).
Exits 1 on the first failed check, naming it.
"""

import asyncio
import json
import os
import sys
from datetime import timedelta

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client

# Longer than any yield below; shorter than the Rust test's bound on this script.
CALL_TIMEOUT = timedelta(seconds=60)


def fail(what, detail):
    print(f"FAILED {what}: {detail}", flush=True)
    sys.exit(1)


def check(what, got, want):
    if got != want:
        fail(what, f"got {got!r}, want {want!r}")


def check_true(what, cond, detail=""):
    if not cond:
        fail(what, detail)


def result(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


async def call(s, name, args, **kw):
    """A tool call; its structured content (checked against the tool's output schema by
    the SDK for every non-error result) and whether it is an error."""
    r = await s.call_tool(name, args, read_timeout_seconds=CALL_TIMEOUT, **kw)
    text = r.content[0].text if r.content else ""
    if r.structuredContent is not None:
        check(f"{name} text block is the JSON of structuredContent", json.loads(text), r.structuredContent)
    return r.structuredContent, r.isError, text


async def run(s, args, **kw):
    sc, err, text = await call(s, "run", args, **kw)
    check_true(f"run {args['command']!r} is no error", not err, text)
    return sc


# ---- scenarios ---------------------------------------------------------------------------


async def tools(s, opts):
    """The tool list: seven tools, each with valid input and output schemas."""
    from jsonschema import Draft202012Validator

    listed = (await s.list_tools()).tools
    names = [t.name for t in listed]
    check("tool names", names, ["run", "read", "write", "kill", "list", "shell", "shell_view"])
    for t in listed:
        check_true(f"{t.name} has an input schema", t.inputSchema.get("type") == "object")
        check_true(f"{t.name} has an output schema", t.outputSchema and t.outputSchema.get("type") == "object")
        Draft202012Validator.check_schema(t.inputSchema)
        Draft202012Validator.check_schema(t.outputSchema)
        check_true(f"{t.name} has a description", bool(t.description))


async def basics(s, opts):
    """Exit codes, signals, stdout and stderr, stdin given, a timeout, tty, kill, list."""
    r = await run(s, {"command": "echo out; echo err >&2; exit 3"})
    check("exit code", (r["status"], r["exit_code"]), ("completed", 3))
    check("stdout and stderr in order", r["output"], "out\nerr\n")
    check("not truncated", r["truncated"], False)
    check_true("an id", r["id"].startswith("cmd_"), r)
    r = await run(s, {"command": "kill -TERM $$"})
    check("killed by a signal", (r["status"], r["exit_code"], r["signal"]), ("completed", None, "SIGTERM"))
    r = await run(s, {"command": "tr a-z A-Z", "stdin": "given\n"})
    check("stdin given, then its end", r["output"], "GIVEN\n")
    r = await run(s, {"command": "sleep 30", "timeout_ms": 300})
    check("timeout_ms kills", r["status"], "timeout")
    r = await run(s, {"command": "tty; test -t 1 && echo on-a-tty", "tty": True})
    check_true("tty: a terminal", "/dev/pts/" in r["output"] and "on-a-tty" in r["output"], r)
    r = await run(s, {"command": "test -t 1 || echo no-tty"})
    check("no tty by default", r["output"], "no-tty\n")
    r = await run(s, {"command": "echo $GREETING", "env": {"GREETING": "hi"}})
    check("env", r["output"], "hi\n")
    r = await run(s, {"command": "sleep 30", "yield_ms": 100})
    check("still running after yield_ms", r["status"], "running")
    sc, err, text = await call(s, "kill", {"id": r["id"]})
    check_true("kill is no error", not err, text)
    check("kill answers the end", sc["status"], "killed")
    sc, err, _ = await call(s, "list", {})
    ids = [c["id"] for c in sc["commands"]]
    check_true("list shows this client's commands", r["id"] in ids and len(ids) == 8, sc)
    check("list says the kill", [c["status"] for c in sc["commands"] if c["id"] == r["id"]], ["killed"])


async def long_and_input(s, opts):
    """Across yield_ms then read until exit; input() answered as waiting, fed by write;
    output cut head and tail on a character boundary."""
    r = await run(s, {"command": "echo first; sleep 1; echo second", "yield_ms": 200})
    check("running after yield_ms", r["status"], "running")
    check("what came so far", r["output"], "first\n")
    seen = ""
    for _ in range(100):
        sc, err, text = await call(s, "read", {"id": r["id"], "wait_ms": 5000, "until": "exit"})
        check_true("read is no error", not err, text)
        seen += sc["output"]
        if sc["status"] != "running":
            break
    check("read until exit", (sc["status"], sc["exit_code"], seen), ("completed", 0, "second\n"))
    sc, _, _ = await call(s, "read", {"id": r["id"]})
    check("nothing read twice", sc["output"], "")

    r = await run(s, {"command": "python3 -c 'print(\"got\", input())'"})
    check("answered at once as waiting for input", r["status"], "waiting_for_input")
    sc, err, text = await call(s, "write", {"id": r["id"], "input": "fed\n"})
    check_true("write is no error", not err, text)
    check("written", sc["written"], 4)
    sc, _, _ = await call(s, "read", {"id": r["id"], "wait_ms": 10000, "until": "exit"})
    check("fed by write", (sc["status"], sc["output"]), ("completed", "got fed\n"))

    r = await run(s, {"command": "python3 -c 'print(\"é\" * 40000)'", "max_output_bytes": 1000})
    out = r["output"]
    check("cut", r["truncated"], True)
    check_true("head kept", out.startswith("éé"), out[:20])
    check_true("tail kept", out.endswith("éé\n"), out[-20:])
    check_true("marker says what was left out", "bytes of output left out" in out, out)
    check_true("no broken character", "\ufffd" not in out, out)
    check_true("within the limit", len(out.encode()) <= 1000 + 80, len(out.encode()))


async def shells(s, opts):
    """A shell session whose cd and export persist; a named one; shell_view."""
    sc, err, text = await call(s, "shell", {"command": "cd /tmp && export MCP_T=kept"})
    check_true("shell is no error", not err, text)
    check("cd+export", (sc["status"], sc["exit_code"]), ("completed", 0))
    sc, _, _ = await call(s, "shell", {"command": 'pwd; echo "$MCP_T"'})
    check("cd and export persist", sc["output"], "/tmp\nkept\n")
    own = sc["session"]
    sc, _, _ = await call(s, "shell", {"command": "cd /usr", "session": opts["named"]})
    sc, _, _ = await call(s, "shell", {"command": "pwd", "session": opts["named"]})
    check("a named session keeps its own state", sc["output"], "/usr\n")
    sc, err, text = await call(s, "shell_view", {})
    check_true("shell_view is no error", not err, text)
    check("shell_view shows the last command", (sc["session"], sc["output"]), (own, "/tmp\nkept\n"))
    result(own=own, named=opts["named"])


async def gate(s, opts):
    """Deny, ask-approve with progress, ask-reject; an approval outlasting yield_ms, read
    after it is approved; a cancelled call withdrawing its pending approval."""
    sc, err, text = await call(s, "run", {"command": "shutdown -h now"})
    check_true("denied is a tool error", err, text)
    check("denied names the rule", (sc["status"], sc["rule"], sc["justification"]),
          ("denied", "no-shutdown", "not from an agent"))

    progress = []

    async def on_progress(p, total, message):
        progress.append((p, message))

    r = await run(s, {"command": "echo APPROVE_NOW"}, progress_callback=on_progress)
    check("approved, then run", (r["status"], r["output"]), ("completed", "APPROVE_NOW\n"))
    check_true("progress while waiting", len(progress) >= 1, progress)
    check_true("progress names the approval and rule",
               progress[0][1].startswith("waiting for approval appr_") and "(rule echo-ask)" in progress[0][1],
               progress)

    sc, err, text = await call(s, "run", {"command": "echo REJECT_NOW"})
    check_true("rejected is a tool error", err, text)
    check("rejected with feedback", (sc["status"], sc["rule"], sc["feedback"]),
          ("rejected", "echo-ask", "not today"))

    r = await run(s, {"command": "echo APPROVE_LATER", "yield_ms": 300})
    check("outlasts yield_ms", r["status"], "waiting_for_approval")
    check_true("names the approval", r["id"].startswith("appr_") and r["approval"] == r["id"], r)
    check("and the rules", r["rules"], ["echo-ask"])
    open(os.path.join(opts["dir"], "go"), "w").close()
    # A read of the approval returns as soon as it is decided: the command's id from then.
    sc, err, text = await call(s, "read", {"id": r["id"], "wait_ms": 20000, "until": "exit"})
    check_true("read after approval is no error", not err, text)
    check_true("it is a command now", sc["id"].startswith("cmd_") and sc["approval"] == r["id"], sc)
    seen = sc["output"]
    while sc["status"] == "running":
        sc, _, _ = await call(s, "read", {"id": sc["id"], "wait_ms": 5000, "until": "exit"})
        seen += sc["output"]
    check("read after approval", (sc["status"], seen), ("completed", "APPROVE_LATER\n"))

    # Cancelled while its approval is pending: the approval is withdrawn. (The SDK numbers
    # its requests with a counter; the next call gets the next number, and with a
    # progress callback that number is also its progressToken.)
    got = asyncio.Event()

    async def first(p, total, message):
        got.set()

    rid = s._request_id
    task = asyncio.create_task(call(s, "run", {"command": "echo HOLD"}, progress_callback=first))
    await asyncio.wait_for(got.wait(), 20)
    await s.send_notification(types.ClientNotification(types.CancelledNotification(
        params=types.CancelledNotificationParams(requestId=rid, reason="the user changed their mind"))))
    done, _ = await asyncio.wait({task}, timeout=1.0)
    check("a cancelled call is not answered", done, set())
    task.cancel()
    sc, _, _ = await call(s, "list", {})
    check("nothing waits any more", [c for c in sc["commands"] if c["status"] == "waiting_for_approval"], [])


async def lifetime(s, opts):
    """Commands for the Rust test to watch after this client exits."""
    fg = await run(s, {"command": "sleep 300", "yield_ms": 100})
    bg = await run(s, {"command": "sleep 301", "yield_ms": 100, "background": True})
    sc, _, _ = await call(s, "shell", {"command": "true"})
    sc2, _, _ = await call(s, "shell", {"command": "true", "session": opts["named"]})
    result(fg=fg["id"], bg=bg["id"], own_shell=sc["session"], named_shell=sc2["session"])


async def ceiling(s, opts):
    """--cwd: calls run there, or inside it; outside is an error naming it."""
    top = opts["dir"]
    r = await run(s, {"command": "pwd"})
    check("runs in --cwd", r["output"], top + "\n")
    r = await run(s, {"command": "pwd", "cwd": "sub"})
    check("a directory inside it", r["output"], top + "/sub\n")
    for outside in ["/", top + "/..", top + "/sub/../.."]:
        sc, err, text = await call(s, "run", {"command": "pwd", "cwd": outside})
        check_true(f"{outside} is refused", err and "outside" in text and "--cwd" in text, text)
    sc, err, text = await call(s, "run", {"command": "echo x", "max_output_bytes": 10**9})
    check_true("a larger max_output_bytes is capped, not an error", not err, text)


async def plain_run(s, opts):
    r = await run(s, {"command": "echo through-the-sdk; id -u"})
    result(output=r["output"], status=r["status"])


SCENARIOS = {f.__name__: f for f in [tools, basics, long_and_input, shells, gate, lifetime, ceiling, plain_run]}


async def main():
    argv = sys.argv[1:]
    scenario = argv.pop(0)
    opts = {"dir": None, "named": None}
    server = []
    while argv:
        a = argv.pop(0)
        if a == "--dir":
            opts["dir"] = argv.pop(0)
        elif a == "--named":
            opts["named"] = argv.pop(0)
        elif a == "--server":
            server = argv
            argv = []
    params = StdioServerParameters(command=server[0], args=server[1:])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            check("negotiated", init.protocolVersion, types.LATEST_PROTOCOL_VERSION)
            check("server", init.serverInfo.name, "execd")
            check_true("tools capability", init.capabilities.tools is not None)
            check_true("logging capability", init.capabilities.logging is not None)
            await SCENARIOS[scenario](s, opts)
    print("OK", flush=True)


if __name__ == "__main__":
    asyncio.run(main())

"""Drives execd's terminal page (GET /terminal) in a real headless Chromium over the
DevTools protocol (a WebSocket, through the pinned `websockets`), typing and reading back
what a person would: the page's DOM text.

    browser.py --chromium PATH --url http://127.0.0.1:PORT/terminal#token=T --profile DIR

Checks: typing `echo $((6*7))` and Enter shows 42; colours are drawn as the emulator has
them; `vi` draws its screen and `:q` leaves it; Ctrl-C interrupts; a paste runs line by
line; a smaller window reaches `stty size`; a reload shows the same session. Prints one
line per failed check and exits 1 if any failed, 0 otherwise.
"""

import argparse
import asyncio
import json
import re
import subprocess
import sys
import time

import websockets

FAILURES = []
BOUND = 20.0


def check(what, cond, detail=""):
    if not cond:
        FAILURES.append(f"{what}: {detail}")
    return cond


class Page:
    def __init__(self, ws, session):
        self.ws = ws
        self.session = session
        self.next_id = 0
        self.waiting = {}

    async def pump(self):
        async for text in self.ws:
            msg = json.loads(text)
            fut = self.waiting.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)

    async def call(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        fut = asyncio.get_running_loop().create_future()
        self.waiting[self.next_id] = fut
        await self.ws.send(json.dumps(msg))
        reply = await asyncio.wait_for(fut, BOUND)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply.get("result", {})

    async def js(self, expr):
        r = await self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True})
        return r.get("result", {}).get("value")

    async def screen(self):
        return await self.js("document.getElementById('screen').innerText") or ""

    async def until(self, what, pred, bound=BOUND):
        deadline = time.monotonic() + bound
        text = ""
        while time.monotonic() < deadline:
            text = await self.screen()
            if pred(text):
                return text
            await asyncio.sleep(0.05)
        check(what, False, f"the screen was:\n{text}")
        return text

    async def type(self, text):
        await self.call("Input.insertText", {"text": text})

    async def key(self, key, code, vk, modifiers=0):
        for kind in ("keyDown", "keyUp"):
            await self.call(
                "Input.dispatchKeyEvent",
                {"type": kind, "key": key, "code": code, "windowsVirtualKeyCode": vk,
                 "modifiers": modifiers},
            )

    async def enter(self):
        await self.key("Enter", "Enter", 13)

    async def line(self, text):
        await self.type(text)
        await self.enter()

    async def size(self, width, height):
        await self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )


def prompted(text):
    return bool(re.search(r"[#$] *\s*$", text.rstrip("\n")))


def lines(text):
    return [l.rstrip() for l in text.split("\n")]


async def drive(page, url):
    await page.call("Page.enable")
    await page.call("Runtime.enable")
    await page.size(1000, 700)
    await page.call("Page.navigate", {"url": url})
    await page.until("a prompt", prompted)
    # The page's policy let its own script run and nothing else: it is connected.
    bar = await page.js("document.getElementById('bar').textContent")
    check("connected", "connected" in (bar or ""), repr(bar))

    await page.line("echo $((6*7))")
    await page.until("42 on a line of its own", lambda t: "42" in lines(t))
    await page.until("the prompt after 42", prompted)

    await page.line("printf '\\033[31mred-text\\033[0m\\n'")
    await page.until("red-text shown", lambda t: "red-text" in lines(t))
    red = await page.js(
        "[...document.querySelectorAll('#screen span')]"
        ".some(s => s.textContent.includes('red-text') && s.style.color === 'rgb(205, 0, 0)')"
    )
    check("red drawn red", red is True, repr(red))
    await page.until("the prompt after red", prompted)

    # A full-screen program draws on the alternate screen and leaves it.
    await page.line("vi")
    await page.until("vi's empty buffer", lambda t: sum(1 for l in lines(t) if l == "~") >= 3)
    await page.type(":q")
    await page.enter()
    await page.until("vi gone", lambda t: sum(1 for l in lines(t) if l == "~") == 0 and prompted(t))

    # Ctrl-C interrupts what runs.
    await page.line("sleep 100; echo not-interrupted")
    await asyncio.sleep(0.5)
    await page.key("c", "KeyC", 67, modifiers=2)
    await page.until(
        "the prompt after Ctrl-C",
        lambda t: prompted(t) and "^C" in t and "not-interrupted" not in lines(t),
    )

    # A paste: line by line, each run.
    await page.js(
        "(() => { const d = new DataTransfer(); d.setData('text/plain', 'echo p1\\necho p2\\n');"
        " document.dispatchEvent(new ClipboardEvent('paste', {clipboardData: d})); })()"
    )
    await page.until("both pasted lines ran", lambda t: "p1" in lines(t) and "p2" in lines(t))
    await page.until("the prompt after the paste", prompted)

    # A smaller window: the session's terminal follows.
    rows_before = await page.js("document.getElementById('screen').children.length")
    await page.size(640, 360)
    deadline = time.monotonic() + BOUND
    rows = rows_before
    while time.monotonic() < deadline and rows == rows_before:
        await asyncio.sleep(0.05)
        rows = await page.js("document.getElementById('screen').children.length")
    inner = await page.js("[innerWidth, innerHeight, document.getElementById('term').getBoundingClientRect().height]")
    check("fewer rows", rows < rows_before, f"{rows_before} -> {rows}; window {inner}")
    await page.key("l", "KeyL", 76, modifiers=2)  # Ctrl-L: a clear screen
    await page.line("stty size")
    text = await page.until(
        "stty size shows the new rows",
        lambda t: any(re.fullmatch(rf"{rows} \d+", l) for l in lines(t)),
    )
    sizes = [l for l in lines(text) if re.fullmatch(r"\d+ \d+", l)]
    check("stty size", bool(sizes), text)
    # Keys typed before the prompt are the running command's input (and what it leaves
    # unread is discarded at the prompt): the next line waits for it.
    await page.until("the prompt after stty size", prompted)

    # A reload comes back to the same session, its screen as it was.
    search = await page.js("location.search")
    check("the address names the session", "session_id=shell_" in (search or ""), repr(search))
    await page.line("echo before-reload")
    await page.until("before-reload", lambda t: "before-reload" in lines(t))
    await page.call("Page.reload")
    await asyncio.sleep(0.3)
    text = await page.until("the same session after a reload", lambda t: "before-reload" in lines(t))
    await page.until("a prompt after the reload", prompted)
    await page.line("echo after-reload")
    await page.until("typing goes on", lambda t: "after-reload" in lines(t))


async def main():
    p = argparse.ArgumentParser()
    p.add_argument("--chromium", required=True)
    p.add_argument("--url", required=True)
    p.add_argument("--profile", required=True)
    a = p.parse_args()
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={a.profile}", "--remote-debugging-port=0", "about:blank",
    ]
    browser = subprocess.Popen([a.chromium, *flags], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        endpoint = None
        deadline = time.monotonic() + BOUND
        while time.monotonic() < deadline:
            line = browser.stderr.readline()
            if not line:
                break
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                endpoint = m.group(1)
                break
        if not endpoint:
            FAILURES.append("chromium did not say where its DevTools listen")
            return
        async with websockets.connect(endpoint, max_size=2**26, ping_interval=None) as ws:
            page = Page(ws, None)
            pump = asyncio.create_task(page.pump())
            target = await page.call("Target.createTarget", {"url": "about:blank"})
            attached = await page.call(
                "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
            )
            page.session = attached["sessionId"]
            try:
                await drive(page, a.url)
            finally:
                pump.cancel()
    finally:
        browser.kill()
        browser.wait()


try:
    asyncio.run(main())
except Exception as e:  # a failure to say, not a crash to read
    import traceback
    FAILURES.append(f"unexpected exception:\n{traceback.format_exc()}")
for f in FAILURES:
    print(f"FAILED {f}")
sys.exit(1 if FAILURES else 0)

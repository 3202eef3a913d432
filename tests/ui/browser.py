"""Headless Chromium over its DevTools protocol (aiohttp's websocket client): what a page shows
once its own JavaScript ran, read by a script in the page, for what the DOM's text cannot tell
(whether a cell shows its whole text, whether an image loaded and how large it is drawn)."""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
from typing import Any

import aiohttp

WINDOW = "1600,2400"
# [natural width, height] of the artifact shown in the page (MLflow draws it from a blob: URL)
# once it has loaded, else null
PICTURE_LOADED = """(() => {
  const img = [...document.querySelectorAll('img')].find(
    i => i.src.startsWith('blob:') && i.complete && i.naturalWidth);
  return img ? [img.naturalWidth, img.naturalHeight] : null;
})()"""


def evaluate(url: str, script: str, timeout: float = 60.0) -> Any:
    """The value of the JavaScript expression ``script`` in the page at ``url``: evaluated every
    0.5 s from the page's start until it is neither null nor false (the page's own JavaScript
    renders late), its last value after ``timeout`` s."""
    return asyncio.run(_evaluate(url, script, timeout))


async def _evaluate(url: str, script: str, timeout: float) -> Any:
    proc = await asyncio.create_subprocess_exec(
        os.environ.get("CHROMIUM", "chromium"), "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-dev-shm-usage", f"--window-size={WINDOW}", "--remote-debugging-port=0",
        "about:blank", stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    drain = None
    try:
        port = await asyncio.wait_for(_devtools_port(proc.stderr), 60)
        drain = asyncio.ensure_future(proc.stderr.read())  # a full pipe would stall it
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as r:
                page = next(t for t in await r.json() if t["type"] == "page")
            async with session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = itertools.count(1)

                async def call(method: str, **params: Any) -> dict[str, Any]:
                    n = next(ids)
                    await ws.send_json({"id": n, "method": method, "params": params})
                    async for msg in ws:
                        data = json.loads(msg.data)
                        if data.get("id") == n:
                            return data.get("result", {})
                    raise RuntimeError(f"chromium closed the connection during {method}")

                await call("Page.navigate", url=url)
                deadline = time.monotonic() + timeout
                while True:
                    got = await call("Runtime.evaluate", expression=script, returnByValue=True)
                    value = got.get("result", {}).get("value")
                    if value or time.monotonic() > deadline:
                        return value
                    await asyncio.sleep(0.5)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        if drain is not None:
            await drain


async def _devtools_port(stderr: asyncio.StreamReader) -> int:
    """The port of chromium's ``DevTools listening on ws://127.0.0.1:PORT/...`` line."""
    while line := await stderr.readline():
        m = re.search(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
        if m:
            return int(m.group(1))
    raise RuntimeError("chromium ended before it listened for DevTools")

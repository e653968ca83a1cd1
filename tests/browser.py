"""Load a local HTML file in headless Chromium and report what a person's browser would show.

Talks the Chrome DevTools protocol over ``--remote-debugging-pipe`` (NUL-separated JSON on file
descriptors 3 and 4), so it needs nothing beyond the standard library: console messages of level
error or warning, uncaught exceptions and log entries of level error (failed resource loads
included), the DOM's sections, the page's text as a reader sees it, whether every image decoded,
and a full-page PNG screenshot.

``find_chromium`` returns the browser or None. Tests skip when it is None, unless
``STEPSIM_REQUIRE_BROWSER=1`` (set by .ci/run, which installs Chromium), where they fail.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--hide-scrollbars", "--remote-debugging-pipe")

DOM_PROBE = """JSON.stringify({
  sections: [...document.querySelectorAll('section')].map(s => [s.id, (s.querySelector('h2') || {}).textContent]),
  answers: [...document.querySelectorAll('div.answer h3')].map(h => h.textContent),
  images: [...document.images].map(i => i.complete && i.naturalWidth > 0),
  scripts: document.scripts.length,
  text: document.body.innerText.length,
  body: document.body.innerText,
  height: document.documentElement.scrollHeight
})"""


def find_chromium() -> str | None:
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def require_browser() -> bool:
    return os.environ.get("STEPSIM_REQUIRE_BROWSER") == "1"


class _Pipe:
    def __init__(self, proc, write_fd: int, read_fd: int):
        self.proc, self.w, self.r = proc, write_fd, read_fd
        self.buf = b""
        self.next_id = 0
        self.events: list[dict] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> int:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        return self.next_id

    def _read_one(self, deadline: float) -> dict:
        while b"\0" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.r], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self.r, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        want = self.send(method, params, session)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_one(deadline)
            if msg.get("id") == want:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 60) -> dict:
        for i, ev in enumerate(self.events):
            if ev.get("method") == method:
                return self.events.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            msg = self._read_one(deadline)
            if msg.get("method") == method:
                return msg
            self.events.append(msg)


def _high(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD, 10)


def inspect_page(html_path: str | Path, width: int = 1200, height: int = 900) -> dict:
    """Open ``html_path`` and return ``errors`` (strings), ``dom`` (see DOM_PROBE) and ``png`` bytes
    of the whole page."""
    browser = find_chromium()
    if browser is None:
        raise FileNotFoundError("no Chromium found")
    url = Path(html_path).resolve().as_uri()
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()
    a, b = _high(to_chrome_r), _high(from_chrome_w)

    def child_fds():
        os.dup2(a, 3)
        os.dup2(b, 4)

    with tempfile.TemporaryDirectory(prefix="stepsim-chromium-") as profile:
        proc = subprocess.Popen([browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                                 "about:blank"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, preexec_fn=child_fds, pass_fds=(3, 4))
        for fd in (to_chrome_r, from_chrome_w, a, b):
            os.close(fd)
        pipe = _Pipe(proc, to_chrome_w, from_chrome_r)
        try:
            target = pipe.call("Target.createTarget", {"url": "about:blank"})["targetId"]
            session = pipe.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log"):
                pipe.call(f"{domain}.enable", session=session)
            pipe.call("Page.navigate", {"url": url}, session=session)
            pipe.wait_event("Page.loadEventFired")
            probe = pipe.call("Runtime.evaluate", {"expression": DOM_PROBE, "returnByValue": True}, session=session)
            dom = json.loads(probe["result"]["value"])
            shot = pipe.call("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                             session=session)
            errors = []
            for ev in pipe.events:
                method, params = ev.get("method"), ev.get("params", {})
                if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
                    errors.append("console: " + " ".join(str(x.get("value", x.get("description", "")))
                                                         for x in params.get("args", [])))
                elif method == "Runtime.exceptionThrown":
                    errors.append("exception: " + params.get("exceptionDetails", {}).get("text", ""))
                elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                    entry = params["entry"]
                    errors.append(f"log: {entry.get('text', '')} {entry.get('url', '')}".strip())
            try:
                pipe.call("Browser.close", timeout=10)
            except (RuntimeError, TimeoutError):
                pass
        finally:
            os.close(to_chrome_w)
            os.close(from_chrome_r)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return {"errors": errors, "dom": dom, "png": base64.b64decode(shot["data"])}


def ink_fraction(png: bytes) -> float:
    """Share of pixels that are not (near) white."""
    import io

    from PIL import Image

    im = Image.open(io.BytesIO(png)).convert("L")
    hist = im.histogram()
    return 1 - sum(hist[246:]) / sum(hist)

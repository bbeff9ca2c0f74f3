"""A real headless Chromium, driven over its DevTools pipe (no Playwright, no Selenium).

``--remote-debugging-pipe`` makes Chromium read DevTools commands from fd 3
and answer on fd 4 (JSON messages ending in a NUL byte): enough to load a
page, evaluate JavaScript in it and take a screenshot.
"""

from __future__ import annotations

import base64
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from typing import Any

__all__ = ["CHROMIUM", "Browser"]

#: the Chromium binary (Debian's ``chromium`` package), or None
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One headless Chromium showing ``url`` in a ``width`` x ``height`` window."""

    def __init__(self, url: str, width: int = 1280, height: int = 900) -> None:
        assert CHROMIUM is not None
        self._profile = tempfile.TemporaryDirectory(prefix="nexus-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def fds() -> None:  # in the child: the pipe's ends become fds 3 and 4
            high_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",  # CI runs as root in a container
                "--disable-gpu",
                "--no-first-run",
                "--disable-extensions",
                "--remote-debugging-pipe",
                f"--user-data-dir={self._profile.name}",
                f"--window-size={width},{height}",
                url,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            pass_fds=(3, 4),
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._ids = itertools.count(1)
        self._answers: dict[int, dict[str, Any]] = {}
        self._arrived = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()
        self._session = self._attach()

    def _read(self) -> None:
        buffer = b""
        while chunk := os.read(self._from_chrome, 1 << 16):
            buffer += chunk
            *messages, buffer = buffer.split(b"\0")
            for raw in messages:
                message = json.loads(raw)
                if "id" in message:
                    with self._arrived:
                        self._answers[message["id"]] = message
                        self._arrived.notify_all()

    def send(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        number = next(self._ids)
        message: dict[str, Any] = {"id": number, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        with self._arrived:
            if not self._arrived.wait_for(lambda: number in self._answers, 30):
                raise AssertionError(f"Chromium did not answer {method}")
            answer = self._answers.pop(number)
        if "error" in answer:
            raise AssertionError(f"Chromium refused {method}: {answer['error']}")
        return dict(answer["result"])

    def _attach(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pages = [
                t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page"
            ]
            if pages:
                answer = self.send(
                    "Target.attachToTarget", targetId=pages[0]["targetId"], flatten=True
                )
                return str(answer["sessionId"])
            time.sleep(0.1)
        raise AssertionError("Chromium opened no page")

    def evaluate(self, expression: str) -> Any:
        """The value of ``expression`` in the page (JSON-serializable)."""
        answer = self.send(
            "Runtime.evaluate", self._session, expression=expression, returnByValue=True
        )
        if "exceptionDetails" in answer:
            raise AssertionError(f"{expression!r} raised in the page: {answer}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate ``expression`` until it is truthy (an exception counts as not
        yet: the page may still be loading); returns its value."""
        guarded = f"(() => {{ try {{ return ({expression}); }} catch (e) {{ return null; }} }})()"
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(guarded)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def screenshot(self, scale: float = 1.0) -> bytes:
        """A PNG of the whole page, at ``scale`` device pixels per CSS pixel."""
        height = int(self.evaluate("document.documentElement.scrollHeight"))
        width = int(self.evaluate("document.documentElement.scrollWidth"))
        self.send(
            "Emulation.setDeviceMetricsOverride",
            self._session,
            width=width,
            height=height,
            deviceScaleFactor=scale,
            mobile=False,
        )
        data = self.send("Page.captureScreenshot", self._session, format="png")["data"]
        return base64.b64decode(data)

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        os.close(self._to_chrome)
        self._profile.cleanup()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

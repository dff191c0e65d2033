"""The chat page of ``examples/web/app.py`` in a real browser: Debian's headless Chromium,
driven by Playwright (``executable_path``: no browser download).

The example runs as a user runs it (a subprocess on a free port, with its own worker process,
on the suite's redis-server). Without Chromium (``apt-get install chromium``) or Playwright the
test skips locally and fails with ``CI=true``, like the Redis tests.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests._redis_server import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Page

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "web" / "app.py"
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _missing(what: str) -> None:
    if _in_ci():
        pytest.fail(f"CI=true and {what}", pytrace=False)
    pytest.skip(what)


def chromium_binary() -> str:
    """Debian's Chromium (``$CHROMIUM`` wins); skip or fail (CI) when absent."""
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")
    if found is None:
        _missing("chromium is not installed (apt-get install -y chromium)")
    assert found is not None
    return found


@pytest.fixture
def chat_app(redis_url: str, tmp_path: Path) -> Iterator[str]:
    """``examples/web/app.py`` on a free port; its base URL. Stopped with SIGTERM, which must
    end it (and its worker) cleanly."""
    port = free_port()
    log = tmp_path / "app.log"
    env = {**os.environ, "EXAMPLE_TOKEN_DELAY": "0.1"}
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(APP), "--redis-url", redis_url, "--port", str(port),
             "--prefix", f"web-{port}"],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
        )
    try:
        deadline = time.monotonic() + 30
        while "chat page:" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"examples/web/app.py did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"examples/web/app.py ignored SIGTERM:\n{log.read_text()}")
    assert code == 0, log.read_text()
    assert "Traceback" not in log.read_text(), log.read_text()


def words(page: Page, selector: str) -> int:
    return len(page.inner_text(selector).split())


@pytest.mark.redis
@pytest.mark.slow
def test_chat_page_streams_stops_queues_and_resumes(chat_app: str, tmp_path: Path) -> None:
    executable = chromium_binary()
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[test]')")
        raise

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1000, "height": 640})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(chat_app)
            expect(page.locator("#status")).to_have_attribute("data-state", "idle")
            thread = page.inner_text("#thread")
            api = f"{chat_app}/api/threads/{thread}"

            # 1. A question: tokens stream in; Stop aborts the run (run.cancelled).
            page.fill("#message", "What is a lease?")
            page.click("#send")
            first = page.locator(".msg.agent").first
            expect(first).to_contain_text("You asked")
            page.wait_for_function(
                "document.querySelector('.msg.agent').textContent.trim().split(/\\s+/).length >= 5")
            page.click("#stop")
            expect(page.locator("#status")).to_have_attribute("data-state", "cancelled")
            expect(first).to_have_class(re.compile(r"\bcancelled\b"))
            stopped_at = words(page, ".msg.agent >> nth=0")
            shot = tmp_path / "chat-stopped.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"\nscreenshot (stopped answer): {shot}")
            assert stopped_at < 40, "the answer was not cut short"

            # 2. A second question; a third waits in the queue and is cancelled there.
            page.fill("#message", "And a fencing token?")
            page.click("#send")
            second = page.locator(".msg.agent").nth(1)
            expect(second).to_contain_text("fencing token")
            page.fill("#message", "Never mind")
            page.click("#send")
            queued = page.locator("#queue li", has_text="Never mind")
            queued.locator("button", has_text="cancel").click()
            expect(page.locator(".msg.user.withdrawn")).to_contain_text("Never mind")
            expect(page.locator("#queue")).not_to_contain_text("Never mind")

            # 3. Reload mid-answer: the page resumes after its last cursor; the answer ends
            # with exactly the text the agent acknowledged (no gap, no repeated token).
            assert "done" not in (second.get_attribute("class") or "")
            page.reload()
            expect(page.locator("#status")).to_have_attribute("data-state", "done",
                                                              timeout=20_000)
            answer = page.locator(".msg.agent").nth(1)
            signal_id = (answer.get_attribute("id") or "").removeprefix("m-agent-")
            receipt = httpx.get(f"{api}/signals/{signal_id}").json()
            assert receipt["status"] == "processed", receipt
            assert answer.inner_text().strip() == receipt["result"]["text"]
            assert words(page, ".msg.agent >> nth=0") == stopped_at  # kept across the reload
            final = tmp_path / "chat-resumed.png"
            page.screenshot(path=str(final), full_page=True)
            print(f"screenshot (after the reload): {final}")
            assert not errors, errors
        finally:
            browser.close()

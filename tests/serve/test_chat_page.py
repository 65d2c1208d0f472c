"""The chat page (GET /) in a real browser: Playwright drives the system Chromium (no browser
download): a message typed and sent streams text into the reply, Stop ends it (and the server frees
the slot), the reply's tokens/s are shown, nothing is logged to the console as an error, and no
request leaves the machine."""
from __future__ import annotations

import shutil
from urllib.parse import urlparse

import pytest

sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package (the dev extra)")
httpx = pytest.importorskip("httpx")

from tests.serve.conftest import LiveServer, wait_until  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]


def until(page, condition, timeout: float = 30) -> None:
    """Poll `condition()` from Python (the page's Content-Security-Policy forbids evaluated strings,
    which page.wait_for_function would use)."""
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"the page never got there; it shows: {page.inner_text('body')[-600:]!r}")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")
def test_the_chat_page_streams_stops_and_stays_on_this_machine(tiny_gguf):
    server = LiveServer(str(tiny_gguf), "--ctx-size", "32768", "--max-batch", "2")  # a reply long enough to stop
    try:
        page_session(server)
    finally:
        assert server.stop() == 0


def page_session(server):
    assert "http" not in httpx.get(server.url + "/").text.replace("http-equiv", "")  # no address in the page
    errors, hosts = [], set()
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.on("console", lambda m: m.type == "error" and errors.append(m.text))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: hosts.add(urlparse(r.url).netloc or r.url.split(":")[0]))
            page.goto(server.url + "/")
            until(page, lambda: ".gguf" in page.inner_text("#model"))
            page.fill("#temperature", "0")
            page.fill("#max_tokens", "30000")
            page.fill("#input", "Hello there")
            page.click("#send")
            reply = page.locator(".msg.assistant .text").last
            until(page, lambda: len(reply.inner_text()) > 0)
            assert page.locator(".msg.user").first.inner_text() == "Hello there"
            until(page, lambda: len(reply.inner_text()) > 20)  # streamed: it grows while we watch
            try:
                page.click("#stop", timeout=10_000)
            except sync_api.Error as e:
                raise AssertionError(f"Stop: {e.message.splitlines()[0]}; the page shows "
                                     f"{page.inner_text('body')[-300:]!r}; the server said {server.text_log()[-2000:]}")
            until(page, lambda: "stopped" in page.locator(".stats").first.inner_text())
            shown = reply.inner_text()
            assert shown and page.is_enabled("#send") and not page.is_enabled("#stop")
            assert wait_until(lambda: httpx.get(server.url + "/health").json()["running"] == 0, timeout=10)
            page.wait_for_timeout(300)
            assert reply.inner_text() == shown  # nothing more came after Stop
            # a second turn: the conversation goes on, ends by itself, and shows its rate
            page.fill("#max_tokens", "12")
            page.fill("#input", "And again")
            page.press("#input", "Enter")
            until(page, lambda: page.locator(".stats").count() == 2
                  and "finish" in page.locator(".stats").nth(1).inner_text())
            stats = page.locator(".stats").nth(1).inner_text()
            assert "tok/s" in stats and "12 tokens" in stats, stats
            assert page.locator(".msg.user").count() == 2
        finally:
            browser.close()
    assert errors == []
    local = urlparse(server.url).netloc
    assert hosts <= {local, "data"}, hosts  # the page and its API calls only (the icon is a data: URL)

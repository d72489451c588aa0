"""/docs (Swagger UI) and /redoc (ReDoc) of the session's `crescent up` in headless Chromium
that reaches the stack alone: each page renders the API from files the gateway serves, and
asks nothing of any other host (no CDN, no fonts, no favicon from elsewhere). ReDoc's logo of
Redocly, from Redocly's CDN, is the one thing the pages' policy has to refuse.

(Named to sort after test_global_cache.py, whose stack shares the session's NATS server and
its nodes' names: the session's stack must not be up beside it.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.stack import Stack
from tests.e2e.test_status_page import chromium

pytestmark = pytest.mark.slow
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

STACK_HOST = "127.0.0.1"
#: Chromium as an isolated renderer: no sandbox (root in CI), no GPU, nothing fetched in the
#: background, and no name but the stack's resolves (the routes below stop the rest first).
FLAGS = (
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
    f"--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE {STACK_HOST}",
)  # fmt: skip
RENDER_MS = 60_000


REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


class Browser:
    """One offline page at a time. Every request for another host is recorded: aborted when
    it reaches the network (``routed``), or refused by the page's Content-Security-Policy
    before it leaves the browser (``blocked``); every uncaught script error in ``errors``."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(service_workers="block")
        self.routed: list[str] = []
        self.asked: list[str] = []
        self.blocked: list[str] = []
        self.errors: list[str] = []
        self.context.route("**/*", self._guard)
        self.context.on("request", self._asked)
        self.context.on("requestfailed", self._failed)

    def _guard(self, route: Any) -> None:
        if urlsplit(route.request.url).hostname == STACK_HOST:
            route.continue_()
        else:
            self.routed.append(route.request.url)
            route.abort()

    def _asked(self, request: Any) -> None:
        # Every request, a worker's too; data: and blob: URLs stay inside the page.
        url = request.url
        if url.startswith("http") and urlsplit(url).hostname != STACK_HOST:
            self.asked.append(url)

    def _failed(self, request: Any) -> None:
        if request.failure == "csp":
            self.blocked.append(request.url)

    def escaped(self) -> list[str]:
        """Requests for another host that left the browser (or might have)."""
        return self.routed + [url for url in self.asked if url not in self.blocked]

    def open(self, url: str) -> Any:
        page = self.context.new_page()
        page.on("pageerror", lambda exc: self.errors.append(str(exc)))
        response = page.goto(url, wait_until="load", timeout=RENDER_MS)
        assert response is not None and response.status == 200, url
        assert "default-src 'self'" in response.headers["content-security-policy"], url
        return page

    def settle(self, page: Any) -> None:
        """Waits until the page has nothing in flight, so every failure is reported."""
        page.wait_for_load_state("networkidle", timeout=RENDER_MS)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    executable = chromium()
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=list(FLAGS))
        yield Browser(launched)
        launched.close()


def docs_url(stack: Stack, path: str) -> str:
    return stack.base_url.removesuffix("/v1") + path


def local_icon(page: Any) -> str:
    """The page's favicon, which must come from the stack too."""
    href = page.locator("link[rel*='icon']").first.get_attribute("href")
    url = page.evaluate("href => new URL(href, document.baseURI).href", href)
    assert urlsplit(url).hostname == STACK_HOST, url
    assert httpx.get(url, timeout=10).status_code == 200, url
    return str(url)


def test_swagger_ui_renders_every_operation_offline(stack: Stack, browser: Browser) -> None:
    page = browser.open(docs_url(stack, "/docs"))
    chat = page.locator(".opblock-summary-path[data-path='/v1/chat/completions']")
    chat.first.wait_for(state="visible", timeout=RENDER_MS)
    for path in ("/v1/completions", "/v1/responses", "/v1/models", "/health"):
        assert page.locator(f".opblock-summary-path[data-path='{path}']").count() >= 1, path
    # The stack has API keys: the schema declares them, so "Authorize" can send one.
    assert page.locator("button.authorize").first.is_visible()
    local_icon(page)
    browser.settle(page)
    assert browser.escaped() == [] and browser.blocked == [], browser.asked
    assert browser.errors == [], browser.errors
    page.close()


def test_redoc_renders_offline(stack: Stack, browser: Browser) -> None:
    page = browser.open(docs_url(stack, "/redoc"))
    title = page.locator("h1", has_text="Crescent gateway")
    title.first.wait_for(state="visible", timeout=RENDER_MS)
    page.get_by_text("/v1/chat/completions").first.wait_for(state="attached", timeout=RENDER_MS)
    assert page.locator("[data-section-id^='operation/']").count() >= 5
    local_icon(page)
    browser.settle(page)
    assert browser.escaped() == [], browser.escaped()
    assert browser.errors == [], browser.errors
    # ReDoc 2 always shows Redocly's logo from its CDN: the policy refuses it, nothing else.
    assert set(browser.blocked) <= {REDOC_LOGO}, browser.blocked
    page.close()


def test_the_docs_need_no_api_key(stack: Stack) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert httpx.get(docs_url(stack, path), timeout=10).status_code == 200, path
    schema = httpx.get(docs_url(stack, "/openapi.json"), timeout=10).json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert chat["security"] == [{"ApiKey": []}]
    assert "security" not in schema["paths"]["/health"]["get"]

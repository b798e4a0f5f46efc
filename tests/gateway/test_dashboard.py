"""``/dashboard`` over HTTP: the admin key (Bearer or Basic), the files, their headers, the
off switch. The page's behaviour in a browser: ``test_dashboard_browser.py``."""

from __future__ import annotations

import base64
import importlib.resources
import re
from collections.abc import Iterator

import pytest

from sluicegate.gateway.ops.dashboard import ASSETS
from tests.gateway.gateway_harness import (
    ADMIN_KEY,
    Reply,
    Stack,
    admin_state,
    http_call,
    openai_error,
    stack,
)

TENANT_KEY = "sk-dashboard-tests-tenant"
BODY = """    max_concurrency: 2
tenants:
  - {name: a, api_key_env: KEY_A}
"""
TYPES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "charts.js": "text/javascript; charset=utf-8",
    "view.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
PATHS = ["/dashboard", *(f"/dashboard/{name}" for name in TYPES)]


def basic(user: str, password: str) -> dict[str, str]:
    """An ``Authorization: Basic`` header for ``user``/``password``."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def bearer(key: str) -> dict[str, str]:
    """An ``Authorization: Bearer`` header."""
    return {"Authorization": f"Bearer {key}"}


def packaged(name: str) -> bytes:
    """The bytes of a dashboard file as shipped in the package."""
    root = importlib.resources.files("sluicegate.gateway.ops").joinpath("dashboard")
    return root.joinpath(name).read_bytes()


@pytest.fixture(scope="module")
def gateway() -> Iterator[Stack]:
    """A gateway with the admin key and one tenant."""
    with stack(BODY, environ={"KEY_A": TENANT_KEY}) as live:
        yield live


def get(gateway: Stack, path: str, headers: dict[str, str] | None = None) -> Reply:
    """``GET path`` with ``headers``."""
    return http_call(gateway.base_url, "GET", path, headers=headers)


def assert_hardened(reply: Reply) -> None:
    """The headers every dashboard answer carries: no caching, a strict CSP with no
    inline script or style and nothing from other origins, no sniffing, no framing."""
    assert reply.headers["cache-control"] == "no-store"
    assert reply.headers["x-content-type-options"] == "nosniff"
    csp = dict(
        [*part.strip().split(" ", 1), ""][:2]
        for part in reply.headers["content-security-policy"].split(";")
    )
    assert csp["default-src"] == "'self'"
    assert csp["script-src"] == "'self'"
    assert csp["style-src"] == "'self'"
    assert csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'"
    assert "unsafe" not in reply.headers["content-security-policy"]


CREDENTIALS = {
    "none": {},
    "wrong bearer": bearer("wrong-admin-key"),
    "wrong basic": basic("admin", "wrong-admin-key"),
    "tenant bearer": bearer(TENANT_KEY),
    "tenant basic": basic("admin", TENANT_KEY),
    "admin key as user name": basic(ADMIN_KEY, "x"),
    "basic without password": basic("admin", ""),
    "other scheme": {"Authorization": f"Token {ADMIN_KEY}"},
}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("headers", CREDENTIALS.values(), ids=CREDENTIALS.keys())
def test_without_the_admin_key_every_dashboard_path_answers_401_with_a_basic_challenge(
    gateway: Stack, path: str, headers: dict[str, str]
) -> None:
    """No key, a wrong key, a tenant's key (Bearer or as the Basic password), the key as
    the user name, or another scheme: 401 with ``WWW-Authenticate: Basic realm="sluicegate"``
    (so a browser asks for the key), an OpenAI-shaped body, and no file content."""
    reply = get(gateway, path, headers)
    assert reply.status == 401
    assert re.match(r'Basic realm="sluicegate"(,|$)', reply.headers["www-authenticate"])
    error = openai_error(reply)
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_admin_key")
    assert_hardened(reply)


def test_two_authorization_headers_are_refused_even_if_one_is_the_admin_key(
    gateway: Stack,
) -> None:
    """A request with the admin key and a second ``Authorization`` header gets 401: which
    one counts would depend on the reader."""
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", gateway.gateway_port, timeout=10)
    try:
        connection.putrequest("GET", "/dashboard")
        connection.putheader("Authorization", f"Bearer {ADMIN_KEY}")
        connection.putheader("Authorization", basic("admin", ADMIN_KEY)["Authorization"])
        connection.endheaders()
        assert connection.getresponse().status == 401
    finally:
        connection.close()


@pytest.mark.parametrize(
    "headers",
    [bearer(ADMIN_KEY), basic("admin", ADMIN_KEY), basic("", ADMIN_KEY)],
    ids=["bearer", "basic", "basic without user name"],
)
@pytest.mark.parametrize("name", TYPES)
def test_with_the_admin_key_each_file_is_served_as_packaged_with_its_type(
    gateway: Stack, headers: dict[str, str], name: str
) -> None:
    """With the admin key, as a bearer token or as the Basic password (any user name), every
    file answers 200 with its content type, its packaged bytes and the hardening headers."""
    path = "/dashboard" if name == "index.html" else f"/dashboard/{name}"
    reply = get(gateway, path, headers)
    assert reply.status == 200
    assert reply.headers["content-type"] == TYPES[name]
    assert reply.body == packaged(name)
    assert_hardened(reply)


def test_the_served_files_are_exactly_the_packaged_ones(gateway: Stack) -> None:
    """What the module serves is what the package ships: nothing missing, nothing extra."""
    shipped = {
        entry.name
        for entry in importlib.resources.files("sluicegate.gateway.ops")
        .joinpath("dashboard")
        .iterdir()
    }
    assert set(ASSETS) == set(TYPES) == shipped


@pytest.mark.parametrize(
    "path", ["/dashboard/nope.js", "/dashboard/..%2Fops.py", "/dashboard/%2E%2E"]
)
def test_other_paths_under_dashboard_are_404_for_the_admin(gateway: Stack, path: str) -> None:
    """Only the listed files are served: anything else (or a path escape) is 404."""
    reply = get(gateway, path, bearer(ADMIN_KEY))
    assert reply.status == 404
    assert openai_error(reply)["code"] == "not_found"


def test_the_page_is_self_contained_with_no_inline_code_and_nothing_from_outside() -> None:
    """The strict CSP holds: no inline script, style or handler; every reference is a
    relative path under dashboard/ or a data: URL; no file names another origin (the page
    must work air-gapped: no CDN, no web font)."""
    html = packaged("index.html").decode()
    scripts = re.findall(r"<script\b([^>]*)>(.*?)</script>", html, re.S | re.I)
    assert scripts, "the page has no script"
    for attributes, body in scripts:
        assert 'src="' in attributes, attributes
        assert body.strip() == "", body
    assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=|javascript:", html, re.I)
    references = re.findall(r'\s(?:src|href)="([^"]*)"', html)
    assert "dashboard/app.js" in references
    for reference in references:
        assert reference.startswith(("dashboard/", "data:")), reference
    for name in TYPES:
        text = packaged(name).decode()
        assert not re.search(
            r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}/", text.replace("http://www.w3.org/2000/svg", "")
        ), name
        assert "@import" not in text, name
        assert "@font-face" not in text, name


def test_when_disabled_the_dashboard_is_404_even_for_the_admin() -> None:
    """``server.dashboard: false``: every dashboard path answers 404 (no challenge, no
    content) whatever the credentials, while ``/admin/state`` keeps working."""
    with stack(BODY + "server:\n  dashboard: false\n", environ={"KEY_A": TENANT_KEY}) as live:
        for path in PATHS:
            for headers in ({}, bearer(ADMIN_KEY), basic("admin", ADMIN_KEY)):
                reply = get(live, path, headers)
                assert reply.status == 404, (path, headers)
                assert "www-authenticate" not in reply.headers
                assert openai_error(reply)["code"] == "not_found"
        assert "models" in admin_state(live.base_url)


def test_the_admin_state_the_page_polls_accepts_the_same_basic_credentials(gateway: Stack) -> None:
    """The page's fetches re-send the Basic credentials the browser asked for: the admin
    key as the Basic password opens ``/admin/state``; a tenant key does not."""
    assert get(gateway, "/admin/state", basic("admin", ADMIN_KEY)).status == 200
    assert get(gateway, "/admin/state", basic("admin", TENANT_KEY)).status == 401

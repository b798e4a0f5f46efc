"""``auth``: API key → tenant (``KeyRing``), and the bearer token of a header or a request."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from sluicegate.gateway.request.auth import MAX_TOKEN_CHARS, KeyRing, bearer, request_token

KEYS = {"sk-alpha-canary-1": "alpha", "sk-beta-canary-2": "beta"}
ADMIN = "admin-canary-3"
TOKENS = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Zs", "Zl", "Zp", "Cc")), min_size=1
)


def test_known_keys_resolve_to_their_tenants() -> None:
    """Each configured key resolves to the tenant it was given for."""
    ring = KeyRing(KEYS, ADMIN)
    assert [ring.tenant(key) for key in KEYS] == ["alpha", "beta"]


@pytest.mark.parametrize(
    "token", ["", "sk-alpha-canary", "sk-alpha-canary-1 ", "SK-ALPHA-CANARY-1"]
)
def test_near_misses_resolve_to_no_tenant(token: str) -> None:
    """Only the exact key matches: prefixes, padding and case changes resolve to None."""
    assert KeyRing(KEYS, ADMIN).tenant(token) is None


def test_admin_key_is_not_a_tenant_key_and_vice_versa() -> None:
    """The admin key names no tenant, and no tenant key is the admin key."""
    ring = KeyRing(KEYS, ADMIN)
    assert ring.is_admin(ADMIN)
    assert ring.tenant(ADMIN) is None
    assert not any(ring.is_admin(key) for key in KEYS)


@pytest.mark.parametrize("admin", [None, ""])
def test_without_an_admin_key_nothing_is_admin(admin: str | None) -> None:
    """With no (or an empty) admin key configured, no token, not even "", is the admin."""
    ring = KeyRing(KEYS, admin)
    assert not ring.is_admin("")
    assert not ring.is_admin(ADMIN)


def test_ring_keeps_no_key_in_clear() -> None:
    """The ring holds digests only: no key appears in its serialised state."""
    dumped = pickle.dumps(KeyRing(KEYS, ADMIN))
    for secret in [*KEYS, ADMIN]:
        assert secret.encode() not in dumped


def test_lone_surrogates_in_a_token_do_not_raise() -> None:
    """A token that is not valid UTF-8 text (as a raw header can decode to) just misses."""
    ring = KeyRing(KEYS, ADMIN)
    assert ring.tenant("sk-\udcff") is None
    assert not ring.is_admin("\udcff")


@settings(deadline=None)
@given(token=TOKENS)
def test_bearer_returns_the_token(token: str) -> None:
    """``Bearer TOKEN`` (any case of the scheme) gives TOKEN back unchanged."""
    assert bearer(f"Bearer {token}") == token
    assert bearer(f"bearer {token}") == token
    assert bearer(f"BEARER {token}") == token


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer  padded  ", "padded"), ("Bearer\tx", None), ("Bearer a b", "a b")],
)
def test_bearer_strips_surrounding_space_only(header: str, token: str | None) -> None:
    """Spaces around the token are dropped; the scheme is separated by a space."""
    assert bearer(header) == token


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", "Bearer    ", "Basic dXNlcjpwYXNz", "sk-raw-key", "Token x"],
)
def test_bearer_rejects_anything_else(header: str | None) -> None:
    """Missing headers, other schemes, bare keys and empty tokens give None."""
    assert bearer(header) is None


def test_bearer_refuses_tokens_longer_than_any_key() -> None:
    """A token over ``MAX_TOKEN_CHARS`` is refused unhashed; one at the limit is returned."""
    assert bearer("Bearer " + "k" * MAX_TOKEN_CHARS) == "k" * MAX_TOKEN_CHARS
    assert bearer("Bearer " + "k" * (MAX_TOKEN_CHARS + 1)) is None


def _headers(*authorizations: str) -> Headers:
    return Headers(raw=[(b"authorization", value.encode("latin-1")) for value in authorizations])


def test_request_token_reads_the_one_authorization_header() -> None:
    """Exactly one ``Authorization: Bearer TOKEN`` gives TOKEN; none gives None."""
    assert request_token(_headers("Bearer sk-alpha-canary-1")) == "sk-alpha-canary-1"
    assert request_token(_headers()) is None
    assert request_token(_headers("Basic eDp5")) is None


@pytest.mark.parametrize(
    "pair",
    [("Bearer sk-alpha-canary-1", "Bearer other"), ("Bearer other", "Bearer sk-alpha-canary-1"),
     ("Bearer sk-alpha-canary-1", "Bearer sk-alpha-canary-1")],
)  # fmt: skip
def test_request_token_refuses_two_authorization_headers(pair: tuple[str, str]) -> None:
    """Two Authorization headers are ambiguous, whatever they hold: None."""
    assert request_token(_headers(*pair)) is None

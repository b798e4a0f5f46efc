"""API key → tenant, compared in constant time; keys are never logged or echoed."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping, Sequence

from starlette.datastructures import Headers

# Longer bearer tokens are refused unhashed; real API keys are well under 200 characters.
MAX_TOKEN_CHARS = 4096


class KeyRing:
    """Resolves bearer tokens to tenants.

    Keys are stored only as SHA-256 digests, in a dict keyed by digest: a
    lookup hashes the presented token and costs the same with 1 or 10,000
    tenants. Timing can at most tell how a digest the client cannot steer
    compares with stored ones, which reveals nothing about any key.
    """

    __slots__ = ("_admin", "_tenants")

    def __init__(self, keys: Mapping[str, str], admin_key: str | None = None) -> None:
        self._tenants = {hashlib.sha256(k.encode()).digest(): t for k, t in keys.items()}
        self._admin = hashlib.sha256(admin_key.encode()).digest() if admin_key else None

    def tenants(self) -> frozenset[str]:
        """Every tenant a key names: those a request (or a batch line) can belong to."""
        return frozenset(self._tenants.values())

    def tenant(self, token: str) -> str | None:
        """The tenant owning ``token``, or ``None``."""
        return self._tenants.get(hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest())

    def is_admin(self, token: str) -> bool:
        """Whether ``token`` is the admin key (always false when none is configured)."""
        if self._admin is None:
            return False
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        return hmac.compare_digest(self._admin, digest)


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, or ``None``.

    ``None`` too for a token longer than ``MAX_TOKEN_CHARS`` (no key is that long).
    """
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_CHARS:
        return None
    return token


def request_token(headers: Headers) -> str | None:
    """The bearer token of a request that has exactly one ``Authorization`` header.

    Two or more are refused (``None``), whatever they hold: which one counts
    would otherwise depend on the reader, and a proxy in front may have checked
    a different one than the gateway uses.
    """
    return only_bearer(headers.getlist("authorization"))


def only_bearer(values: Sequence[str]) -> str | None:
    """The bearer token of the only ``Authorization`` value; ``None`` for none or several."""
    return bearer(values[0]) if len(values) == 1 else None


def basic_password(authorization: str) -> str | None:
    """The password of an ``Authorization: Basic base64(user:password)`` value, or ``None``.

    The user name is ignored: a browser asks for both, and the admin key is the password.
    """
    scheme, _, encoded = authorization.partition(" ")
    encoded = encoded.strip()
    if scheme.lower() != "basic" or not encoded or len(encoded) > 2 * MAX_TOKEN_CHARS:
        return None
    try:
        decoded = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    if not colon or not password or len(password) > MAX_TOKEN_CHARS:
        return None
    return password


def admin_token(headers: Headers) -> str | None:
    """The key an admin request presents: a bearer token, or an HTTP Basic password (so a
    browser can open ``/dashboard``); ``None`` for none, several ``Authorization`` headers,
    or another scheme."""
    values = headers.getlist("authorization")
    if len(values) != 1:
        return None
    token = bearer(values[0])
    return token if token is not None else basic_password(values[0])


def admin_bearer(headers: Headers) -> str | None:
    """The key a state-changing admin request presents: only ``Authorization: Bearer``.

    HTTP Basic is refused here: a browser caches it once the dashboard was opened and
    would send it with any form another site makes it post.
    """
    return request_token(headers)


def same_digest(token: str, digest: bytes) -> bool:
    """Whether ``token`` hashes to ``digest`` (SHA-256), compared in constant time."""
    presented = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
    return hmac.compare_digest(presented, digest)

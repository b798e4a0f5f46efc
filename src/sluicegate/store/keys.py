"""Names of the store's Redis keys (the layout is described in ``redis_store``).

Every key of one model shares the hash tag ``{<prefix>:<model>}``, so one Lua
script can touch all of a model's state; a tenant's rate buckets live under
their own tag ``{<prefix>:rate:<tenant>}``. The Lua scripts build the rest of a
model's key names from ``model_base``.
"""

from __future__ import annotations

import os
import secrets
import socket

__all__ = ["check_replica_id", "default_replica_id", "grants_key", "model_base", "rate_key"]

_FORBIDDEN_IN_REPLICA = ("|", "\t")


def model_base(prefix: str, model: str) -> str:
    """The common start of all of ``model``'s keys: ``{<prefix>:<model>}:``."""
    return f"{{{prefix}:{model}}}:"


def grants_key(prefix: str, model: str, replica: str) -> str:
    """The list of ``replica``'s tickets granted by other replicas' syncs in ``model``."""
    return f"{model_base(prefix, model)}grants:{replica}"


def rate_key(prefix: str, tenant: str) -> str:
    """The hash holding ``tenant``'s request and token buckets."""
    return f"{{{prefix}:rate:{tenant}}}"


def check_replica_id(replica: str) -> str:
    """Return ``replica`` if it can name a replica in the store's keys and members.

    Raises:
        ValueError: if it is empty or contains ``|`` or a tab (``|`` separates
            the parts of a waiting set's member).
    """
    if not replica or any(char in replica for char in _FORBIDDEN_IN_REPLICA):
        raise ValueError(f"a replica id must be non-empty, without '|' or tabs: {replica!r}")
    return replica


def default_replica_id() -> str:
    """``<hostname>-<pid>-<8 random hex digits>``: unique across restarts and hosts."""
    host = socket.gethostname().replace("|", "-").replace("\t", "-") or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(4)}"

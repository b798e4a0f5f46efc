"""The errors of the shared store, and what a failed batch-storage call means.

redis-py puts a pipeline command's arguments into its error's message ("Command # 1
(RPUSH key <the uploaded line>…) of pipeline caused error: …"), so a storage error is
never logged or answered with its original message: ``storage_error`` turns it into a
``StorageError`` whose text names only the kind of failure.
"""

from __future__ import annotations

import errno
import sqlite3

from redis.exceptions import (
    BusyLoadingError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from sluicegate.errors import SluicegateError

__all__ = ["StorageError", "StoreUnavailableError", "storage_error"]


class StoreUnavailableError(SluicegateError):
    """The store could not be reached or did not answer within its timeout.

    Every Redis error, timeout and connection error surfaces as this one type, so
    the gateway has a single failure to switch to its ``on_store_failure`` mode on.
    The original error is the ``__cause__``; ``timed_out`` says it was a deadline passed
    (a slow answer, perhaps only a busy event loop), not a refused or lost connection.
    """

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class StoreSessionLostError(StoreUnavailableError):
    """The store answers but does not know this replica's session: it restarted empty or
    reaped the replica as dead, and with it the replica's leases and waiters. Never
    retried: the replica falls back and rejoins with a new session (its resync)."""


class StorageError(SluicegateError):
    """Batch storage failed a call: ``full`` (it refuses to grow: Redis at ``maxmemory``, a
    full disk) or unavailable (unreachable, too slow, refusing writes for another reason).

    ``reason`` (also the message) names the failure, e.g. ``redis OOM``, ``sqlite
    SQLITE_FULL``, ``redis TimeoutError``: safe to log, it never holds request content.
    """

    def __init__(self, reason: str, *, full: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.full = full


_SQLITE_FULL = 13
_SQLITE_UNAVAILABLE = frozenset(
    {
        5,  # SQLITE_BUSY: another writer held the lock past busy_timeout
        6,  # SQLITE_LOCKED
        8,  # SQLITE_READONLY
        10,  # SQLITE_IOERR (and its extended codes)
        11,  # SQLITE_CORRUPT
        14,  # SQLITE_CANTOPEN
        15,  # SQLITE_PROTOCOL
        26,  # SQLITE_NOTADB
    }
)
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
_DISK_FAILING = frozenset({errno.EIO, errno.EROFS})
_REPLY_CODES = frozenset(
    {"MISCONF", "NOREPLICAS", "MASTERDOWN", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "WRONGTYPE"}
)
"""Error replies redis-py has no class for (the code stays the message's first word); only
these are named in a reason, so that no word of a command's arguments can be."""
_ANNOTATION = ") of pipeline caused error: ("


def storage_error(error: BaseException) -> StorageError | None:
    """What ``error``, raised by a batch backend, means as a ``StorageError``; None if it is
    no storage failure (a bug, which stays what it is)."""
    if isinstance(error, StorageError):
        return error
    if isinstance(error, RedisError):
        return _redis(error)
    if isinstance(error, sqlite3.Error):
        code = getattr(error, "sqlite_errorcode", None)
        if code is None:
            return None
        name = getattr(error, "sqlite_errorname", str(code))
        if code & 0xFF == _SQLITE_FULL:
            return StorageError(f"sqlite {name}", full=True)
        if code & 0xFF in _SQLITE_UNAVAILABLE:
            return StorageError(f"sqlite {name}", full=False)
        return None
    if isinstance(error, OSError) and error.errno in _DISK_FULL | _DISK_FAILING:
        name = errno.errorcode.get(error.errno or 0, "OSError")
        return StorageError(f"disk {name}", full=error.errno in _DISK_FULL)
    if isinstance(error, (ConnectionError, TimeoutError)):
        return StorageError(type(error).__name__, full=False)
    return None


def _redis(error: RedisError) -> StorageError:
    if isinstance(error, OutOfMemoryError):
        return StorageError("redis OOM (maxmemory)", full=True)
    kind = type(error)
    if isinstance(error, (RedisConnectionError, RedisTimeoutError, BusyLoadingError)):
        return StorageError(f"redis {kind.__name__}", full=False)
    if isinstance(error, ResponseError) and not isinstance(error, ReadOnlyError) and error.args:
        # A pipeline's annotation holds the command first: read only what follows its end.
        message = str(error.args[0])
        reply = message[message.rfind(_ANNOTATION) + len(_ANNOTATION) :].lstrip("'\"")
        code = reply.split(" ", 1)[0] if _ANNOTATION in message else message.split(" ", 1)[0]
        if code in _REPLY_CODES:
            return StorageError(f"redis {code}", full=False)
    return StorageError(f"redis {kind.__name__}", full=False)

"""Store URLs: ``redis://``, ``rediss://`` and ``unix://`` parsed as redis-py reads them.

This module owns turning a store URL into a :class:`RedisAddress` (where to connect,
how to log in, which database) and a ``rediss://`` URL's options into an
``ssl.SSLContext``; :mod:`sluicegate.store.resp` connects with them. Config checks use
:func:`parse_redis_url` alone, so a bad URL is refused at load without connecting.

URLs: ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS; query
``ssl_cert_reqs``, ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
``ssl_check_hostname``), ``unix://[[user]:password@]/path``; ``?db=N`` and
``?password=``/``?username=`` anywhere, as redis-py reads them.

With ``distributed.cluster`` the URL names one node of a Redis Cluster (a seed; a name
that resolves to several nodes is best), ``check_cluster_url`` says what cannot work there,
and ``node_url`` gives the URL of each node the cluster announces, with the seed's
credentials and TLS options.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit, urlunsplit

__all__ = ["RedisAddress", "check_cluster_url", "node_url", "parse_redis_url", "tls_context"]

_IGNORED_QUERY = frozenset(
    {
        "socket_timeout",
        "socket_connect_timeout",
        "socket_keepalive",
        "health_check_interval",
        "max_connections",
        "retry_on_timeout",
        "timeout",
        "client_name",
        "protocol",
    }
)
"""redis-py connection options that mean nothing here (the store sets its own timeouts)."""
_TLS_QUERY = frozenset(
    {"ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"}
)


@dataclass(frozen=True, slots=True)
class RedisAddress:
    """Where a Redis listens and how to log in: parsed from a store URL."""

    host: str = "localhost"
    port: int = 6379
    path: str | None = None  # a unix socket, instead of host and port
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: dict[str, str] | None = None  # rediss://: the ssl_* options of the query


def parse_redis_url(url: str) -> RedisAddress:
    """Parse ``redis://``, ``rediss://`` and ``unix://`` URLs the way redis-py does.

    Raises:
        ValueError: another scheme, a bad ``db``, or a query option this client lacks.
    """
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("a Redis URL starts with redis://, rediss:// or unix://")
    query = {name: values[0] for name, values in parse_qs(parts.query).items() if values}
    unknown = set(query) - _IGNORED_QUERY - _TLS_QUERY - {"db", "username", "password"}
    if unknown:
        raise ValueError(f"unsupported Redis URL option(s): {sorted(unknown)}")
    username = unquote(parts.username) if parts.username else query.get("username")
    password = unquote(parts.password) if parts.password else query.get("password")
    db_text = query.get("db")
    if db_text is None and parts.scheme != "unix" and parts.path.strip("/"):
        db_text = unquote(parts.path).replace("/", "")
    try:
        db = int(db_text) if db_text else 0
    except ValueError:
        raise ValueError("the Redis URL's database must be a number") from None
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// Redis URL needs a socket path")
        return RedisAddress(path=unquote(parts.path), db=db, username=username, password=password)
    tls = None
    if parts.scheme == "rediss":
        tls = {name: value for name, value in query.items() if name in _TLS_QUERY}
    return RedisAddress(
        host=unquote(parts.hostname) if parts.hostname else "localhost",
        port=parts.port or 6379,
        db=db,
        username=username,
        password=password,
        tls=tls,
    )


def tls_context(options: dict[str, str]) -> ssl.SSLContext:
    """The TLS context a ``rediss://`` URL's ``ssl_*`` options ask for."""
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
    reqs = options.get("ssl_cert_reqs", "required").lower()
    modes = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}
    if reqs not in modes:
        raise ValueError(f"ssl_cert_reqs must be one of {sorted(modes)}")
    checking = options.get("ssl_check_hostname", "true").lower() in ("1", "true", "yes", "y")
    context.check_hostname = checking and reqs == "required"
    context.verify_mode = modes[reqs]
    if "ssl_certfile" in options:
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    return context


def check_cluster_url(url: str) -> None:
    """Refuse a store URL that cannot name a node of a Redis Cluster.

    Raises:
        ValueError: a ``unix://`` URL (cluster nodes announce ``host:port``, reached over
            TCP) or a database other than 0 (a cluster has only database 0); the message
            never echoes the URL (it may carry a password).
    """
    address = parse_redis_url(url)
    if address.path is not None:
        raise ValueError(
            "distributed.cluster: a Redis Cluster is reached over TCP (its nodes announce "
            "host:port), not a unix:// socket; name one node as redis://host:port"
        )
    if address.db != 0:
        raise ValueError(
            "distributed.cluster: a Redis Cluster has only database 0; "
            f"remove the database {address.db} from the store URL"
        )


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (a cluster's seed) with its host and port replaced by a node's: the same
    scheme, credentials and query (TLS options)."""
    parts = urlsplit(url)
    login = parts.netloc.rpartition("@")[0]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    netloc = f"{login}@{where}" if login else where
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))

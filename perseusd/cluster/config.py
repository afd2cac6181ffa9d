"""`ClusterConfig`: the cluster plane's settings, validated once (the daemon's configuration carries one)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from perseusd.errors import ConfigError

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Node and job names: they become etcd key components, so no slashes and nothing to escape."""

MIN_LEASE_TTL_S = 2
"""etcd grants no lease shorter than 1.5 election timeouts (about 2 s with its default settings)."""


@dataclass(frozen=True)
class Endpoint:
    """One etcd client URL, split."""

    scheme: str
    host: str
    port: int

    @property
    def url(self) -> str:
        """The endpoint as a URL (`http://127.0.0.1:2379`)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """`http://host:port`, `https://host:port` or `host:port` (http) as an `Endpoint`.

    Raises:
        ConfigError: the text is not such an address.
    """
    parts = urlsplit(text if "://" in text else f"http://{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or port is None
        or parts.path not in ("", "/")
    ):
        raise ConfigError(f"invalid configuration: etcd endpoint {text!r} is not http(s)://HOST:PORT")
    return Endpoint(parts.scheme, parts.hostname, port)


@dataclass(frozen=True)
class ClusterConfig:
    """Where etcd is and how this node takes part. Units are in the names.

    `lease_ttl_s` bounds how long a dead node's facts outlive it, and how long this node trusts its view of
    the others after losing etcd. The plane works in rounds of `refresh_interval_s` (publish what changed,
    refresh the views, keep the lease alive every third of the TTL).
    """

    endpoints: tuple[str, ...]
    node_name: str
    lease_ttl_s: int = 10
    timeout_s: float = 1.0
    prefix: str = "/perseus/v1"
    refresh_interval_s: float = 0.5

    def __post_init__(self) -> None:
        if not self.endpoints:
            raise ConfigError("invalid configuration: the cluster plane needs at least one etcd endpoint")
        for endpoint in self.endpoints:
            parse_endpoint(endpoint)
        _require(
            NAME_PATTERN.fullmatch(self.node_name) is not None, "node_name must match " + NAME_PATTERN.pattern
        )
        _require(MIN_LEASE_TTL_S <= self.lease_ttl_s <= 3600, f"lease_ttl_s must be {MIN_LEASE_TTL_S}..3600")
        _require(0 < self.timeout_s <= 60, "timeout_s must be in (0, 60]")
        _require(
            0 < self.refresh_interval_s <= self.lease_ttl_s / 3, "refresh_interval_s must be in (0, TTL/3]"
        )
        _require(
            self.prefix.startswith("/") and not self.prefix.endswith("/") and "//" not in self.prefix,
            "prefix must start with '/' and not end with '/'",
        )

    @property
    def parsed_endpoints(self) -> tuple[Endpoint, ...]:
        """The endpoints, split."""
        return tuple(parse_endpoint(e) for e in self.endpoints)

    @property
    def keepalive_interval_s(self) -> float:
        """How often the lease is renewed: a third of the TTL, so two renewals can fail before it expires."""
        return self.lease_ttl_s / 3

    @property
    def stale_after_s(self) -> float:
        """A view not refreshed for this long is marked stale (half the TTL; it is still served)."""
        return self.lease_ttl_s / 2


def _require(condition: bool, problem: str) -> None:
    if not condition:
        raise ConfigError(f"invalid configuration: cluster {problem}")

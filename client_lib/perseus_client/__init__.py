"""The Perseus client library: training processes talk to perseusd through `PerseusClient`.

Import-light: pyzmq and the wire protocol module only. The names below are loaded when first used, so that
`import perseus_client.protocol` (the daemon, perseusctl, tools reading frames) never loads the client and
zmq.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from perseus_client.client import PerseusClient, PerseusClientError
    from perseus_client.clock_messages import PlanEntry
    from perseus_client.protocol import PROTOCOL_VERSION, ErrorCode
    from perseus_client.version import PROTOCOL_MAJOR, PROTOCOL_MINOR

__all__ = [
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PROTOCOL_VERSION",
    "ErrorCode",
    "PerseusClient",
    "PerseusClientError",
    "PlanEntry",
]

_HOMES = {
    "PerseusClient": "perseus_client.client",
    "PerseusClientError": "perseus_client.client",
    "PROTOCOL_VERSION": "perseus_client.protocol",
    "ErrorCode": "perseus_client.codes",
    "PlanEntry": "perseus_client.clock_messages",
    "PROTOCOL_MAJOR": "perseus_client.version",
    "PROTOCOL_MINOR": "perseus_client.version",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'perseus_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value

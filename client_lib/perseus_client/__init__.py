"""The Perseus client library: training processes talk to perseusd through `PerseusClient`.

Import-light: pyzmq and the wire protocol module only.
"""

from __future__ import annotations

from perseus_client.client import PerseusClient, PerseusClientError
from perseus_client.protocol import PROTOCOL_VERSION, ErrorCode, PlanEntry

__all__ = ["PROTOCOL_VERSION", "ErrorCode", "PerseusClient", "PerseusClientError", "PlanEntry"]

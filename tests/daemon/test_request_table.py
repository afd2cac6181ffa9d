"""The one request table: every request type of the protocol has exactly one handler per socket."""

from __future__ import annotations

from typing import TypeVar

import pytest
from perseus_client.protocol import ADMIN_TYPES, EVENT_TYPES, REQUEST_TYPES, Hello, StatusRequest

from perseusd.daemon.requests.cap import CapRequests
from perseusd.daemon.requests.energy import EnergyRequests
from perseusd.daemon.requests.gpu import GpuRequests
from perseusd.daemon.requests.job import JobRequests
from perseusd.daemon.requests.pool import PoolRequests
from perseusd.daemon.requests.slurm import SlurmRequests
from perseusd.daemon.requests.table import RequestFamilies, _joined, request_table

T = TypeVar("T")


def _unbuilt(kind: type[T]) -> T:
    """An instance whose handlers the table can name (the table calls none of them)."""
    return object.__new__(kind)


def test_a_daemon_with_every_part_serves_every_request_of_the_protocol() -> None:
    families = RequestFamilies(
        _unbuilt(GpuRequests),
        _unbuilt(JobRequests),
        _unbuilt(EnergyRequests),
        _unbuilt(SlurmRequests),
        _unbuilt(CapRequests),
        _unbuilt(PoolRequests),
    )
    table = request_table(families)
    # status is the core's own (its rows depend on the socket); events take the event path
    assert set(table.client) == set(REQUEST_TYPES) - {StatusRequest, *EVENT_TYPES}
    assert set(table.admin) == set(ADMIN_TYPES) - {StatusRequest}


def test_a_daemon_without_its_optional_parts_serves_the_gpu_requests_only() -> None:
    table = request_table(RequestFamilies(_unbuilt(GpuRequests)))
    assert Hello in table.client
    assert len(table.client) == 7
    assert len(table.admin) == 2


def test_two_handlers_for_one_request_are_refused() -> None:
    gpus = _unbuilt(GpuRequests)
    with pytest.raises(ValueError, match="two handlers for hello"):
        _joined([{Hello: gpus.hello}, {Hello: gpus.claim}])

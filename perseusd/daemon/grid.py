"""The node's grid signal from the configuration: its source, keeper and poller thread (docs/carbon.md).

Only the configuration names the trace file or the token file: nothing a client sends becomes a path.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from perseusd.carbon.keeper import SignalKeeper, SignalPoller
from perseusd.carbon.sources import ElectricityMaps, ElectricityMapsSettings, SignalSource, TraceReplay
from perseusd.carbon.traces import SignalError, load_trace
from perseusd.daemon.config import DaemonConfig
from perseusd.errors import ConfigError
from perseusd.jobs.carbon_steering import CarbonSettings, CarbonSteering

logger = logging.getLogger(__name__)


def signal_source(config: DaemonConfig) -> SignalSource | None:
    """The configured source (None: off). A trace that cannot be read is a configuration error."""
    if config.signal_source == "trace":
        path = Path(config.signal_trace)
        try:
            points = load_trace(path)
        except SignalError as exc:
            raise ConfigError(f"signal_trace: {exc}") from None
        return TraceReplay(points, config.signal_trace_speed, name=path.name)
    if config.signal_source == "electricitymaps":
        settings = ElectricityMapsSettings(
            config.signal_zone, config.signal_token_file, config.signal_api_url
        )
        return ElectricityMaps(settings)
    return None


@contextlib.contextmanager
def carbon_steering(config: DaemonConfig) -> Iterator[CarbonSteering]:
    """The carbon steering of the job manager, with its signal poller running (stopped on exit)."""
    settings = CarbonSettings(config.carbon_interval_s, config.carbon_eta, config.carbon_reference_intensity)
    source = signal_source(config)
    if source is None:
        yield CarbonSteering(None, settings)
        return
    keeper = SignalKeeper(
        source.describe(), config.signal_unit, config.signal_max_age_s, config.carbon_forecaster
    )
    poller = SignalPoller(source, keeper, config.signal_poll_s)
    logger.info("grid signal: %s, read every %g s", source.describe(), config.signal_poll_s)
    poller.start()
    try:
        yield CarbonSteering(keeper, settings)
    finally:
        poller.stop()

"""Prometheus metrics of the daemon: a collector over the core's counters and its two exposures."""

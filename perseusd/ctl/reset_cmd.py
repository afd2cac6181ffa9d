"""`perseusctl reset [GPU ...]` (admin): restore saved originals, unlock clocks and drop leases."""

from __future__ import annotations

import argparse
from pathlib import Path

from perseus_client.protocol import AdminReset, AdminResetOk

from perseusd.ctl.daemon_link import ask

HELP = "admin: restore GPUs and drop their leases"
EXIT_OK = 0
EXIT_FAILED = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("gpus", nargs="*", metavar="GPU_UUID", help="GPUs to reset (default: all)")


def run(args: argparse.Namespace) -> int:
    reply = ask(Path(args.runtime_dir), AdminReset(gpus=tuple(args.gpus)), AdminResetOk, admin=True)
    for gpu in reply.gpus:
        print(f"reset {gpu}")
    for gpu in reply.failed:
        print(f"FAILED {gpu}")
    return EXIT_FAILED if reply.failed else EXIT_OK

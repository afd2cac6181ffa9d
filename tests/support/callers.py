"""The callers unit tests of the core speak as: this process (`ME`), and a user who is not this one
(`OTHER`: another uid, not an admin unless this test runs as uid -1)."""

from __future__ import annotations

import os

from perseusd.leasing.identity import Caller

ME = Caller(uid=os.getuid(), gid=os.getgid(), pid=os.getpid())
OTHER = Caller(uid=os.getuid() + 1, gid=os.getgid(), pid=os.getpid() + 1)

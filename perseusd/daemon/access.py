"""Who may connect and who is an admin: root, the daemon's own user, and members of the configured groups."""

from __future__ import annotations

import os

from perseusd.leasing.identity import Caller, group_id, in_group


class AccessPolicy:
    """Decisions on kernel-attested callers, cached per (uid, gid) until `clear_cache` (SIGHUP)."""

    def __init__(self, socket_group: str, admin_group: str, daemon_uid: int | None = None) -> None:
        self._socket_gid = group_id(socket_group)
        self._admin_gid = group_id(admin_group)
        self._daemon_uid = os.geteuid() if daemon_uid is None else daemon_uid
        self._connect_cache: dict[tuple[int, int], bool] = {}
        self._admin_cache: dict[tuple[int, int], bool] = {}

    @property
    def socket_gid(self) -> int | None:
        return self._socket_gid

    @property
    def admin_gid(self) -> int | None:
        return self._admin_gid

    def may_connect(self, caller: Caller) -> bool:
        """Root, the daemon's user, members of the socket group and admins may use the control plane."""
        key = (caller.uid, caller.gid)
        allowed = self._connect_cache.get(key)
        if allowed is None:
            allowed = self._privileged(caller) or in_group(caller, self._socket_gid) or self.is_admin(caller)
            self._connect_cache[key] = allowed
        return allowed

    def is_admin(self, caller: Caller) -> bool:
        """Root, the daemon's user and members of the admin group."""
        key = (caller.uid, caller.gid)
        admin = self._admin_cache.get(key)
        if admin is None:
            admin = self._privileged(caller) or in_group(caller, self._admin_gid)
            self._admin_cache[key] = admin
        return admin

    def clear_cache(self) -> None:
        self._connect_cache.clear()
        self._admin_cache.clear()

    def _privileged(self, caller: Caller) -> bool:
        return caller.uid in (0, self._daemon_uid)

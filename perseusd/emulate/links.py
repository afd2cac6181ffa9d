"""A stage process's inbox: messages from its neighbours arrive in any order; a stage waits for one of them.

Each stage has one `multiprocessing` queue that every neighbour writes to. Waiting takes messages off the
queue and keeps those not waited for yet, so a backward that arrives while the stage waits for a forward is
not lost. Waits poll, so a stage whose coordinator died notices and stops instead of waiting forever.
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Hashable
from multiprocessing.queues import Queue as MpQueue
from typing import Any

from perseusd.emulate.messages import Activation, IterationStart

POLL_S = 0.2
"""How often a waiting stage checks that its coordinator still lives."""


class CoordinatorGoneError(Exception):
    """The coordinator process died: the stage stops (and releases its GPU)."""


class Inbox:
    """The messages for one stage process."""

    def __init__(self, messages: MpQueue[Any], coordinator_alive: Callable[[], bool]) -> None:
        self._messages = messages
        self._alive = coordinator_alive
        self._stash: dict[Hashable, Activation | IterationStart] = {}

    def wait_activation(self, activation: Activation) -> None:
        """Block until the neighbour's computation `activation` stands for has finished."""
        self._wait(activation)

    def wait_iteration_start(self, iteration: int) -> IterationStart:
        """Block until the previous stage passes on the start of `iteration` (with the command)."""
        message = self._wait(("start", iteration))
        assert isinstance(message, IterationStart)
        return message

    def _wait(self, key: Hashable) -> Activation | IterationStart:
        while key not in self._stash:
            try:
                message = self._messages.get(timeout=POLL_S)
            except queue.Empty:
                if not self._alive():
                    raise CoordinatorGoneError("the coordinator exited") from None
                continue
            self._stash[_key(message)] = message
        return self._stash.pop(key)


def _key(message: Activation | IterationStart) -> Hashable:
    if isinstance(message, IterationStart):
        return ("start", message.iteration)
    return message

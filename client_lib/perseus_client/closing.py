"""`Closing`: the base of the objects that are their own context manager, closed when the `with` ends."""

from __future__ import annotations

from typing import TypeVar

_Self = TypeVar("_Self", bound="Closing")


class Closing:
    """`with thing as t:` gives the object itself and calls its `close()` on the way out (error or not)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _Self) -> _Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

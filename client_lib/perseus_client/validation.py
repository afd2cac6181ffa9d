"""Strict validation of decoded JSON bodies against the protocol's message dataclasses (stdlib only).

Every field is checked against its type hint: ints are never bools and fit in 64 bits, floats accept ints
and must be finite (never NaN or infinite), tuples are JSON lists, nested dataclasses are objects; missing
and extra fields are rejected. Errors are `ProtocolError` with code BAD_FIELD and the path of the field
(`set_plan.plan[3].freq_mhz`).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Literal

from perseus_client.codes import ErrorCode, ProtocolError

MAX_ABS_INT = (1 << 63) - 1
"""Integers on the wire fit in 64 bits (larger ones are refused, whatever the field)."""
_Checker = typing.Callable[[Any, str], Any]
_FIELD_CACHE: dict[type, tuple[tuple[str, _Checker], ...]] = {}


def build(cls: type[Any], body: dict[str, Any], where: str) -> Any:
    fields = _fields_of(cls)
    names = {name for name, _ in fields}
    extra = set(body) - names
    if extra:
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: unexpected field(s) {sorted(extra)}")
    kwargs: dict[str, Any] = {}
    for name, check in fields:
        if name not in body:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: missing field '{name}'")
        kwargs[name] = check(body[name], f"{where}.{name}")
    return cls(**kwargs)


def _fields_of(cls: type[Any]) -> tuple[tuple[str, _Checker], ...]:
    cached = _FIELD_CACHE.get(cls)
    if cached is None:
        hints = typing.get_type_hints(cls)
        cached = tuple((f.name, _checker_for(hints[f.name])) for f in dataclasses.fields(cls))
        _FIELD_CACHE[cls] = cached
    return cached


def _bad(where: str, expected: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_FIELD, f"{where}: expected {expected}")


def _checker_for(hint: Any) -> _Checker:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is int:
        return _check_int
    if hint is float:
        return _check_float
    if hint is str:
        return _check_str
    if hint is bool:
        return _check_bool
    if origin is Literal:
        return _literal_checker(args)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional_checker(_checker_for(inner))
    if origin is tuple:
        return _tuple_checker(_checker_for(args[0]))
    if origin is dict:
        return _dict_checker(_checker_for(args[1]))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        cls: type[Any] = hint
        return lambda value, where: _check_object(cls, value, where)
    raise TypeError(f"unsupported protocol field type {hint!r}")


def _check_int(value: Any, where: str) -> int:
    if type(value) is not int:
        raise _bad(where, "an integer")
    if not -MAX_ABS_INT <= value <= MAX_ABS_INT:
        raise _bad(where, f"an integer of at most 64 bits (|n| <= {MAX_ABS_INT})")
    return value


def _check_float(value: Any, where: str) -> float:
    if type(value) not in (int, float):
        raise _bad(where, "a number")
    try:
        number = float(value)
    except OverflowError:
        raise _bad(where, "a finite number") from None
    if not math.isfinite(number):
        raise _bad(where, "a finite number")
    return number


def _check_str(value: Any, where: str) -> str:
    if type(value) is not str:
        raise _bad(where, "a string")
    return value


def _check_bool(value: Any, where: str) -> bool:
    if type(value) is not bool:
        raise _bad(where, "a boolean")
    return value


def _check_object(cls: type[Any], value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise _bad(where, "an object")
    return build(cls, dict(value), where)


def _literal_checker(allowed: tuple[Any, ...]) -> _Checker:
    def check(value: Any, where: str) -> Any:
        if value not in allowed or type(value) is not str:
            raise _bad(where, f"one of {list(allowed)}")
        return value

    return check


def _optional_checker(inner: _Checker) -> _Checker:
    return lambda value, where: None if value is None else inner(value, where)


def _tuple_checker(inner: _Checker) -> _Checker:
    def check(value: Any, where: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise _bad(where, "a list")
        return tuple(inner(item, f"{where}[{i}]") for i, item in enumerate(value))

    return check


def _dict_checker(inner: _Checker) -> _Checker:
    def check(value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _bad(where, "an object")
        return {str(k): inner(v, f"{where}.{k}") for k, v in value.items()}

    return check

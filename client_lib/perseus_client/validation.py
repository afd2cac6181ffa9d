"""Strict validation of decoded JSON bodies against the protocol's message dataclasses (stdlib only).

Every field is checked against its type hint: ints are never bools and fit in 64 bits, floats accept ints
and must be finite (never NaN or infinite), tuples are JSON lists, nested dataclasses are objects. A missing
field is rejected unless it has a default (a field added in a later minor: a frame of an older minor leaves
it out). Extra fields are rejected (`Schema.strict`, requests on the daemon) or ignored (`Schema.tolerant`,
replies on the client: fields added in a newer minor). Errors are `ProtocolError` with code BAD_FIELD and the
path of the field (`set_plan.plan[3].freq_mhz`).
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any, Literal, NamedTuple

from perseus_client.codes import ErrorCode, ProtocolError
from perseus_client.message import VALUE_SINCE

MAX_ABS_INT = (1 << 63) - 1
"""Integers on the wire fit in 64 bits (larger ones are refused, whatever the field)."""
MAX_NAME_CHARS = 256
"""The longest name a request may carry in a name field (`NAME_FIELDS`): a job's name is saved in the
daemon's state file, shown by `perseusctl` and logged, so it must stay small and printable."""
NAME_FIELDS = frozenset({"job", "run", "client_version"})
"""String fields that name something (checked by `check_name` in strict schemas, the daemon's side)."""
_Checker = typing.Callable[[Any, str], Any]


@dataclasses.dataclass(frozen=True)
class Schema:
    """How a body is checked: `strict` refuses unknown fields; fields newer than `minor` count as unknown."""

    strict: bool
    minor: int
    """Fields whose `since` (field metadata, see `perseus_client.version.since`) exceeds it are unknown."""


class _Field(NamedTuple):
    name: str
    check: _Checker
    required: bool


_FIELD_CACHE: dict[tuple[type, Schema], tuple[dict[str, _Field], frozenset[str]]] = {}


def build(cls: type[Any], body: dict[str, Any], where: str, schema: Schema) -> Any:
    fields, names = _fields_of(cls, schema)
    if schema.strict and not names.issuperset(body):
        extra = sorted(set(body) - names)
        raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: unexpected field(s) {extra}")
    kwargs: dict[str, Any] = {}
    for name, spec in fields.items():
        if name in body:
            kwargs[name] = spec.check(body[name], f"{where}.{name}")
        elif spec.required:
            raise ProtocolError(ErrorCode.BAD_FIELD, f"{where}: missing field '{name}'")
    return cls(**kwargs)


def _fields_of(cls: type[Any], schema: Schema) -> tuple[dict[str, _Field], frozenset[str]]:
    cached = _FIELD_CACHE.get((cls, schema))
    if cached is None:
        hints = typing.get_type_hints(cls)
        fields = {
            f.name: _Field(f.name, _field_checker(f.name, hints[f.name], schema), _required(f))
            for f in dataclasses.fields(cls)
            if f.metadata.get("since", 0) <= schema.minor
        }
        cached = _FIELD_CACHE[(cls, schema)] = (fields, frozenset(fields))
    return cached


def _required(f: dataclasses.Field[Any]) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _field_checker(name: str, hint: Any, schema: Schema) -> _Checker:
    if schema.strict and name in NAME_FIELDS and hint is str:
        return check_name
    return _checker_for(hint, schema)


def check_name(value: Any, where: str) -> str:
    """A name field: a string of at most `MAX_NAME_CHARS` printable characters (no control characters, no
    lone surrogates: it reaches terminals, logs and the state file)."""
    if type(value) is not str:
        raise _bad(where, "a string")
    if len(value) > MAX_NAME_CHARS:
        raise _bad(where, f"a name of at most {MAX_NAME_CHARS} characters (got {len(value)})")
    if not value.isprintable():
        raise _bad(where, "a name of printable characters (no control characters or escape sequences)")
    return value


def _bad(where: str, expected: str) -> ProtocolError:
    return ProtocolError(ErrorCode.BAD_FIELD, f"{where}: expected {expected}")


def _checker_for(hint: Any, schema: Schema) -> _Checker:
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
        return _literal_checker(_known_values(args, schema))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_checker(hint, _known_values(tuple(m.value for m in hint), schema))
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return _optional_checker(_checker_for(inner, schema))
    if origin is tuple:
        return _tuple_checker(_checker_for(args[0], schema))
    if origin is dict:
        return _dict_checker(_checker_for(args[1], schema))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        cls: type[Any] = hint
        return lambda value, where: _check_object(cls, value, where, schema)
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
    if number - number != 0.0:  # NaN or infinite (math.isfinite without importing math)
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


def _check_object(cls: type[Any], value: Any, where: str, schema: Schema) -> Any:
    if not isinstance(value, dict):
        raise _bad(where, "an object")
    return build(cls, value, where, schema)


def _literal_checker(allowed: tuple[Any, ...]) -> _Checker:
    def check(value: Any, where: str) -> Any:
        if value not in allowed or type(value) is not str:
            raise _bad(where, f"one of {list(allowed)}")
        return value

    return check


def _known_values(values: tuple[Any, ...], schema: Schema) -> tuple[Any, ...]:
    """The values a side speaking `schema.minor` knows (not those a later minor added: `VALUE_SINCE`)."""
    return tuple(v for v in values if VALUE_SINCE.get(v, 0) <= schema.minor)


def _enum_checker(cls: type[enum.Enum], allowed: tuple[Any, ...]) -> _Checker:
    check_value = _literal_checker(allowed)
    return lambda value, where: cls(check_value(value, where))


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

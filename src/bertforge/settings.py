"""Settings values checked against the type of the config field they set.

A config dataclass's field annotations say what each setting takes; values that arrive from a file
(``--config FILE``, a study file) have no such guarantee: YAML reads ``max_steps: four`` as a string,
``max_steps: true`` as a bool, and ``lr: 1e-4`` (no dot: YAML 1.1) as a string too. `check_value`
holds a value to its field's annotation before the dataclass sees it, so that a wrong value is one
clear error naming the file and the field, not a TypeError deep inside a run.

    check_value("1e-4", float)          # 0.0001: a number written as text is a number
    check_value(True, int)              # SettingValueError: expected an integer, got True
    check_value("fast", float | None)   # SettingValueError: expected a number or none, got 'fast'

`config_from_file` builds a config dataclass from a JSON / YAML file this way (``--config``);
`from_mapping` builds a nested dataclass (a study file's) from a mapping, each error naming the field's
path (`FieldError`); `check_device` checks a ``device`` setting.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

__all__ = ["SettingValueError", "FieldError", "check_value", "field_types", "from_mapping", "read_value",
           "read_mapping", "check_keys", "AS_GIVEN", "OTHER_KEYS", "read_config_file", "config_from_file", "check_device"]


class SettingValueError(ValueError):
    """A value of the wrong kind for its setting; the message says what was expected ("expected a
    number, got 'fast'"), and callers put the file and the field in front of it."""

    def __init__(self, expected: str, value: Any):
        self.expected = expected
        self.value = value
        super().__init__(f"expected {expected}, got {value!r}")


class HugeNumber:
    """A huge integer as a message shows it: "a 401-digit number", not its 401 digits."""

    def __init__(self, value: int):
        self.digits = len(str(abs(value)))

    def __repr__(self) -> str:
        return f"a {self.digits}-digit number"


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _describe(annotation: Any) -> str:
    """What ``annotation`` takes, in words ("an integer", "one of 'a', 'b'", "a list of strings")."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation in _KINDS:
        return _KINDS[annotation]
    if origin is Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin in (Union, types.UnionType):
        words = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(words + (["none"] if type(None) in args else []))
    if origin in (tuple, list):
        item = args[0] if args else Any
        return "a list" + (f" of {_describe(item).removeprefix('an ').removeprefix('a ')}s" if item in _KINDS else "")
    if origin is dict:
        return "a mapping"
    return getattr(annotation, "__name__", str(annotation))


def check_value(value: Any, annotation: Any, *, ints_as_floats: bool = False) -> Any:
    """``value`` if it fits ``annotation`` (a config field's type), else a `SettingValueError`.

    bool, int, float and str are held to their kind: a bool is no integer, a number no string. A float
    field takes an integer, and a number written as text (YAML 1.1 reads ``1e-4`` so) as that number;
    it refuses NaN and infinities, which no setting means. ``X | None`` takes None, ``Literal[...]``
    its values, ``tuple[X, ...]`` / ``list[X]`` a list of X, ``dict[K, V]`` a mapping; other types
    (paths, nested dataclasses, Any) are left to the dataclass. ``ints_as_floats``: an integer for a
    float field is returned as a float (a config file's ``1`` as 1.0)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is float:
        number = value
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                raise SettingValueError(_describe(float), value) from None
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingValueError(_describe(float), value)
        try:
            finite = math.isfinite(number)
        except OverflowError:  # an integer beyond any float
            finite = False
        if not finite:
            raise SettingValueError("a finite number", HugeNumber(value) if isinstance(value, int) else value)
        return float(number) if isinstance(value, str) or ints_as_floats else number
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SettingValueError(_describe(int), value)
        return value
    if annotation in (bool, str):
        if type(value) is not annotation:
            raise SettingValueError(_describe(annotation), value)
        return value
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in args):
            raise SettingValueError(_describe(annotation), value)
        return value
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for option in (a for a in args if a is not type(None)):
            try:
                return check_value(value, option, ints_as_floats=ints_as_floats)
            except SettingValueError:
                continue
        raise SettingValueError(_describe(annotation), value)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise SettingValueError(_describe(annotation), value)
        item = args[0] if args and (origin is list or args[-1] is Ellipsis) else Any
        try:
            items = [check_value(v, item, ints_as_floats=ints_as_floats) for v in value]
        except SettingValueError:
            raise SettingValueError(_describe(annotation), value) from None
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise SettingValueError(_describe(annotation), value)
        key, item = args if args else (Any, Any)
        return {check_value(k, key, ints_as_floats=ints_as_floats): check_value(v, item, ints_as_floats=ints_as_floats)
                for k, v in value.items()}
    return value


def field_types(cls: type) -> dict[str, Any]:
    """The settable fields of the config dataclass ``cls`` (those its constructor takes) -> their types."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


# ---------------------------------------------------------------------------- nested mappings
class FieldError(ValueError):
    """A value refused at a field of a nested mapping: ``where`` is the field's path ("tasks[0] (MR).lr",
    "pretraining"), ``message`` what is wrong with it."""

    def __init__(self, where: str, message: str):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


AS_GIVEN: dict[str, Any] = {"as_given": True}
"""Field metadata: `from_mapping` keeps the value as given (its default when not given), for the caller to
check against the rest of what it reads (names of other parts, say)."""
OTHER_KEYS: dict[str, Any] = {"other_keys": True}
"""Field metadata: the field takes the mapping's keys that are no field's (settings written inline), as
one mapping read at the path of the mapping itself."""


def read_mapping(value: Any, where: str) -> dict[str, Any]:
    """``value`` as a mapping (None: an empty one), else a `FieldError`."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(where, f"expected a mapping, got {type(value).__name__}")
    return dict(value)


def check_keys(data: dict[str, Any], allowed: set[str], where: str) -> None:
    """A `FieldError` naming the keys of ``data`` that are not ``allowed``, and those that are."""
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise FieldError(where, f"unknown key{'s' * (len(unknown) > 1)} {', '.join(map(repr, unknown))}; "
                                f"expected {', '.join(sorted(allowed))}")


def from_mapping(cls: type, data: Any, where: str = "", *, given: dict[str, Any] | None = None) -> Any:
    """The dataclass ``cls`` read from the mapping ``data`` (at ``where`` in a nested file; "": the top
    level), every error a `FieldError` naming the field's path.

    Keys that are no field of ``cls`` are refused (unless a field takes them: `OTHER_KEYS`); ``given``
    holds fields the mapping does not set. Each value is read by its field's annotation (`read_value`);
    a field not given takes its default, and one without a default is read as None, so that its own check
    says what it expected."""
    data = read_mapping(data, where or "top level")
    given = given or {}
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name not in given]
    rest = next((f.name for f in fields if f.metadata.get("other_keys")), None)
    names = {f.name for f in fields} - {rest}
    if rest is None:
        check_keys(data, names, where or "top level")
    hints = typing.get_type_hints(cls, include_extras=True)
    values = dict(given)
    for f in fields:
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if f.name == rest:
            value, path = {k: v for k, v in data.items() if k not in names}, where
        elif f.name in data:
            value, path = data[f.name], f"{where}.{f.name}" if where else f.name
        elif has_default:
            continue
        else:
            value, path = None, f"{where}.{f.name}" if where else f.name
        if f.metadata.get("as_given"):
            values[f.name] = value
        elif value is None and has_default and _empty_means_default(hints[f.name]):
            continue
        else:
            values[f.name] = read_value(value, hints[f.name], path)
    return cls(**values)


def _empty_means_default(annotation: Any) -> bool:
    """Whether a field of this type given as null (YAML's ``key:`` with nothing after it) takes its
    default: a text, a mapping or a nested dataclass does; a number, a flag or a checked field does not."""
    return annotation is str or typing.get_origin(annotation) is dict or dataclasses.is_dataclass(annotation)


def read_value(value: Any, annotation: Any, where: str) -> Any:
    """``value`` read as ``annotation`` says, at the path ``where``: ``Annotated[T, check, ...]`` first
    applies each ``check(value, where)`` (which returns the value, or raises a `SettingValueError` or a
    `FieldError`), then reads T; a dataclass is read by `from_mapping`, a list of them item by item (an
    item named by its position and its ``name`` field: "tasks[0] (MR)"), a mapping value by value (each
    at "where.key"); anything else is held to its type by `check_value`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        for check in annotation.__metadata__:
            try:
                value = check(value, where)
            except SettingValueError as e:
                raise FieldError(where, str(e)) from None
        return read_value(value, args[0], where)
    if dataclasses.is_dataclass(annotation):
        return from_mapping(annotation, value, where)
    if origin in (Union, types.UnionType) and type(None) in args and value is None:
        return None
    options = [a for a in args if a is not type(None)]
    if origin in (Union, types.UnionType) and len(options) == 1 and dataclasses.is_dataclass(options[0]):
        return from_mapping(options[0], value, where)
    if origin in (tuple, list) and args and dataclasses.is_dataclass(args[0]):
        if not isinstance(value, list):
            raise FieldError(where, f"expected a list, got {value!r}")
        items = [_read_item(item, args[0], f"{where}[{i}]") for i, item in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict and args:
        return {k: read_value(v, args[1], f"{where}.{k}") for k, v in read_mapping(value, where).items()}
    if annotation is Any:
        return value
    try:
        return check_value(value, annotation)
    except SettingValueError as e:
        raise FieldError(where, str(e)) from None


def _read_item(item: Any, cls: type, where: str) -> Any:
    """One item of a list of ``cls``: errors name it by its position, and by its name once that is read."""
    item = read_mapping(item, where)
    if "name" in {f.name for f in dataclasses.fields(cls)}:
        name = read_value(item.get("name"), typing.get_type_hints(cls, include_extras=True)["name"], f"{where}.name")
        where = f"{where} ({name})"
    return from_mapping(cls, item, where)


# ---------------------------------------------------------------------------- config files
def read_config_file(file: str | Path) -> dict[str, Any]:
    """Settings from a JSON or (``.yaml`` / ``.yml``) YAML file holding one mapping."""
    from bertforge.io import read_settings_file

    data = read_settings_file(file)
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a mapping of setting names to values")
    return data


def config_from_file(cls: type, file: str | Path, base: Any = None) -> Any:
    """A ``cls`` config dataclass from a JSON / YAML file of its field names (the rest: ``base``'s values, or
    those of the ``recipe`` the file names, or the defaults). Each value is held to its field's type
    (`check_value`); numbers for float fields become floats (YAML 1.1 reads ``lr: 1e-4`` as a string, JSON
    ``1`` is an int)."""
    values = read_config_file(file)
    kinds = field_types(cls)
    unknown = sorted(set(values) - set(kinds))
    if unknown:
        raise ValueError(f"{file}: unknown {cls.__name__} settings: {', '.join(unknown)}")
    checked = {}
    for name, value in values.items():
        try:
            checked[name] = check_value(value, kinds[name], ints_as_floats=True)
        except SettingValueError as e:
            simple = [k for k in typing.get_args(kinds[name]) if k is not type(None)] or [kinds[name]]
            if len(simple) == 1 and simple[0] in _KINDS:  # "vocab_size must be int, got 'many'"
                kind = "a number" if simple[0] is float else simple[0].__name__
                if e.expected == "a finite number":  # nan, inf, an integer beyond any float
                    kind, value = e.expected, e.value
                raise ValueError(f"{file}: {name} must be {kind}, got {value!r}") from None
            raise ValueError(f"{file}: {name}: {e}") from None
    if base is None and "recipe" in checked and hasattr(cls, "from_recipe"):  # a named recipe's settings first
        base = cls.from_recipe(checked["recipe"])
    return dataclasses.replace(base, **checked) if base is not None else cls(**checked)


# ---------------------------------------------------------------------------- devices
def check_device(device: str, *, here: bool = False) -> str:
    """``device`` if bertforge can run on it: auto, cpu, cuda or cuda:K; else a ValueError saying so.
    ``here``: also that this machine has it (a CUDA device PyTorch sees, K below their count), which a
    file written for another machine need not meet until it runs."""
    import torch

    if device == "auto":
        return device
    expected = f"expected auto, cpu, cuda or cuda:K, got {device!r}"
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(expected) from None
    if parsed.type not in ("cpu", "cuda") or (parsed.type == "cpu" and parsed.index not in (None, 0)):
        raise ValueError(expected)
    if here and parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{device}: PyTorch sees no CUDA device on this machine (use cpu or auto)")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"{device}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device

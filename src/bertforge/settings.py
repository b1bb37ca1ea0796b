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
`check_device` checks a ``device`` setting.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

__all__ = ["SettingValueError", "check_value", "field_types", "read_config_file", "config_from_file", "check_device"]


class SettingValueError(ValueError):
    """A value of the wrong kind for its setting; the message says what was expected ("expected a
    number, got 'fast'"), and callers put the file and the field in front of it."""

    def __init__(self, expected: str, value: Any):
        self.expected = expected
        self.value = value
        super().__init__(f"expected {expected}, got {value!r}")


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
        if not math.isfinite(number):
            raise SettingValueError("a finite number", value)
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


# ---------------------------------------------------------------------------- config files
def read_config_file(file: str | Path) -> dict[str, Any]:
    """Settings from a JSON or (``.yaml`` / ``.yml``) YAML file holding one mapping."""
    from bertforge.io import read_settings_file

    data = read_settings_file(file)
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a mapping of setting names to values")
    return data


def config_from_file(cls: type, file: str | Path, base: Any = None) -> Any:
    """A ``cls`` config dataclass from a JSON / YAML file of its field names (the rest: ``base``'s values,
    or the defaults). Each value is held to its field's type (`check_value`); numbers for float fields
    become floats (YAML 1.1 reads ``lr: 1e-4`` as a string, JSON ``1`` is an int)."""
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
                raise ValueError(f"{file}: {name} must be {kind}, got {value!r}") from None
            raise ValueError(f"{file}: {name}: {e}") from None
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

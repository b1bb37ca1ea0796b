"""Settings: each declared once, on its config dataclass field, and read one way from every source.

A field's annotation says what a setting takes and `setting` adds its range and resume rules, held alike
for flags, ``--config`` and study files, inference overrides and Python; every reader's error is a
`FieldError` naming the setting's path ("finetune.lr: ...").

A message that tells the user which setting to change names it as they give it (`option`): as a flag while
a command runs (`speaking_in_flags`), as a keyword argument in Python.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import os
import shlex
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, Union

__all__ = ["option", "speaking_in_flags", "setting", "MAX_MINUTES", "field_metadata", "out_of_range", "check_settings",
           "SettingValueError", "HugeNumber", "FieldError", "check_value", "field_types", "read_settings",
           "from_mapping", "read_value", "read_mapping", "check_keys", "AS_GIVEN", "OTHER_KEYS", "read_config_file",
           "config_from_file", "RUN_FACTS", "RUN_INPUTS", "follow_folder", "check_device"]


# ---------------------------------------------------------------------------- naming
_FLAGS = contextvars.ContextVar("bertforge_flags", default=False)


@contextlib.contextmanager
def speaking_in_flags() -> Iterator[None]:
    """While a command runs: messages name settings as its flags (`option`)."""
    token = _FLAGS.set(True)
    try:
        yield
    finally:
        _FLAGS.reset(token)


def option(name: str, value: Any = None) -> str:
    """Setting ``name`` (with ``value``) as the user gives it: ``--max-steps 5`` / ``--resume`` /
    ``--no-nsp`` while a command runs, ``max_steps=5`` / ``resume=True`` / ``nsp=False`` in Python."""
    if _FLAGS.get():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            return flag if value else f"--no-{name.replace('_', '-')}"
        return flag if value is None else f"{flag} {shlex.quote(value) if isinstance(value, str) else value}"
    return name if value is None else f"{name}={value!r}"


# ---------------------------------------------------------------------------- declaring
_NOT_GIVEN: Any = object()
_INT64 = 2 ** 63
MAX_MINUTES = 60 * 24 * 365 * 100
"""A century: minutes no time setting reaches (a larger one is a typo, and overflows the clocks counting it)."""


def setting(default: Any, *, resumable: bool = False, absent: Any = _NOT_GIVEN, at_least: float | None = None,
            above: float | None = None, below: float | None = None, at_most: float | None = None) -> Any:
    """A config field with ``default``, its range, whether a resumed run may change it (``resumable``) and
    what a recorded run that predates it means by its absence (``absent``)."""
    metadata: dict[str, Any] = {"resumable": resumable}
    if absent is not _NOT_GIVEN:
        metadata["absent"] = absent
    if (at_least, above, below, at_most) != (None,) * 4:
        metadata["range"] = (at_least, above, below, at_most)
    return field(default=default, metadata=metadata)


@functools.lru_cache(maxsize=None)
def field_metadata(config_class: type) -> dict[str, dict[str, Any]]:
    """Each field's metadata, merged over ``config_class``'s MRO (a new default keeps the base's rules)."""
    merged: dict[str, dict[str, Any]] = {}
    for klass in reversed(config_class.__mro__):
        for f in getattr(klass, "__dataclass_fields__", {}).values():
            merged.setdefault(f.name, {}).update({k: v for k, v in f.metadata.items() if k != "resumable" or v})
    return merged


def out_of_range(config_class: type, name: str, value: Any) -> str | None:
    """"must be > 0, got -1" if ``value`` is outside the range of setting ``name``; else None."""
    bounds = field_metadata(config_class).get(name, {}).get("range")
    if bounds is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    at_least, above, below, at_most = bounds
    huge = isinstance(value, int) and not -_INT64 <= value < _INT64  # beyond what torch and numpy count in
    if huge and at_most is None and below is None:
        return f"must be below 2**63, got {HugeNumber(value)!r}"
    if (not huge and (not isinstance(value, float) or math.isfinite(value)) and (at_least is None or value >= at_least)
            and (above is None or value > above) and (below is None or value < below)
            and (at_most is None or value <= at_most)):
        return None

    def show(bound: float) -> str:
        return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"

    if (at_least is None and above is None) or (at_most is None and below is None):  # one side: ">= 0", "> 0"
        words = (f">= {show(at_least)}" if at_least is not None else f"> {show(above)}" if above is not None
                 else f"<= {show(at_most)}" if at_most is not None else f"< {show(below)}")
    else:  # both: "in [0, 1)"
        words = (f"in {'[' if at_least is not None else '('}{show(at_least if at_least is not None else above)}, "
                 f"{show(at_most if at_most is not None else below)}{']' if at_most is not None else ')'}")
    return f"must be {'a finite number ' if isinstance(value, float) else ''}{words}, got {HugeNumber.shown(value)!r}"


@functools.lru_cache(maxsize=None)
def _choices(config_class: type) -> dict[str, tuple[Any, ...]]:
    """The fields of ``config_class`` typed ``Literal[...]`` (or ``Literal[...] | None``) -> their choices."""
    out = {}
    for name, hint in typing.get_type_hints(config_class).items():
        options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        literals = [a for o in options if typing.get_origin(o) is typing.Literal for a in typing.get_args(o)]
        if literals:
            out[name] = tuple(literals) + ((None,) if type(None) in options else ())
    return out


def check_settings(config: Any) -> None:
    """A ValueError naming the first field of ``config`` outside its ``Literal`` choices, outside its range, or
    of another type than its annotation's (`check_value`: no bool for an integer, no float for a count, no
    NaN for a number; a path for a string is taken): a Python caller's values held to the rules of flags and
    files."""
    choices = _choices(type(config))
    kinds = field_types(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.name in choices and value not in choices[f.name]:
            names = ", ".join(str(c) for c in choices[f.name] if c is not None)
            raise ValueError(f"{f.name} must be one of {names}, got {value!r}")
        problem = out_of_range(type(config), f.name, value)
        if problem:
            raise ValueError(f"{f.name} {problem}")
        kind = kinds.get(f.name)
        if kind is not None and not (isinstance(value, os.PathLike) and _takes_text(kind)):
            try:
                check_value(value, kind)
            except SettingValueError as e:
                raise ValueError(f"{f.name}: {e}") from None


def _takes_text(annotation: Any) -> bool:
    """Whether ``annotation`` is ``str`` or an optional one: a path there is read as its text."""
    return annotation is str or (typing.get_origin(annotation) in (Union, types.UnionType)
                                 and str in typing.get_args(annotation))


# ---------------------------------------------------------------------------- values
class SettingValueError(ValueError):
    """A value of the wrong kind for its setting: "expected a number, got 'fast'"."""

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

    @staticmethod
    def shown(value: Any) -> Any:
        """``value`` as a message shows it: an integer beyond 64 bits as a `HugeNumber`."""
        return HugeNumber(value) if isinstance(value, int) and not -_INT64 <= value < _INT64 else value


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
    """``value`` if it fits ``annotation`` (a config field's type), else a `SettingValueError`. A bool is no
    integer and a number no string, but a float field takes an integer or a number written as text (YAML 1.1
    reads ``1e-4`` so), never NaN or infinities; ``ints_as_floats``: an integer for it becomes a float."""
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


@functools.lru_cache(maxsize=None)
def field_types(cls: type) -> Mapping[str, Any]:
    """The fields ``cls``'s constructor takes -> their types (cached: resolving annotations is slow)."""
    hints = typing.get_type_hints(cls)
    return types.MappingProxyType({f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init})


# ---------------------------------------------------------------------------- nested mappings
class FieldError(ValueError):
    """A value refused at a setting: ``where`` is its path ("tasks[0] (MR).lr"; "": the whole)."""

    def __init__(self, where: str, message: str):
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


AS_GIVEN: dict[str, Any] = {"as_given": True}
"""Field metadata: `from_mapping` keeps the value as given, for the caller to check."""
OTHER_KEYS: dict[str, Any] = {"other_keys": True}
"""Field metadata: the field takes the mapping's keys that are no field's (settings written inline)."""


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


def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def read_settings(cls: type, data: Any, where: str = "", *, only: tuple[str, ...] | None = None,
                  refused: Mapping[str, str] | None = None, ints_as_floats: bool = False) -> dict[str, Any]:
    """Some settings of ``cls`` read from the mapping ``data`` (at ``where``), each checked as a field (of
    ``only``) of its type and range; ``refused``: fields the caller sets -> the message that says so."""
    data = read_mapping(data, where or "top level")
    kinds = field_types(cls)
    for name in data:
        if name in (refused or {}):
            raise FieldError(_at(where, name), refused[name])
    check_keys(data, set(only if only is not None else kinds) - set(refused or {}), where)
    checked = {}
    for name, value in data.items():
        try:
            value = check_value(value, kinds[name], ints_as_floats=ints_as_floats)
            if name == "device" and isinstance(value, str):
                check_device(value)
        except ValueError as e:  # a SettingValueError, or check_device's
            raise FieldError(_at(where, name), str(e)) from None
        problem = out_of_range(cls, name, value)
        if problem:
            raise FieldError(_at(where, name), problem)
        checked[name] = value
    return checked


def from_mapping(cls: type, data: Any, where: str = "", *, given: dict[str, Any] | None = None) -> Any:
    """The dataclass ``cls`` read from the mapping ``data`` (at ``where``), ``given`` holding other fields;
    one without a default that is not given is read as None, so that its own check says what it expected."""
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
        elif f.name in data or not has_default:
            value, path = data.get(f.name), _at(where, f.name)
        else:
            continue
        if f.metadata.get("as_given"):
            values[f.name] = value
        elif value is None and has_default and _empty_means_default(hints[f.name]):
            continue
        else:
            values[f.name] = read_value(value, hints[f.name], path)
    return cls(**values)


def _empty_means_default(annotation: Any) -> bool:
    """Whether a field of this type given as null (YAML's ``key:``) takes its default."""
    return annotation is str or typing.get_origin(annotation) is dict or dataclasses.is_dataclass(annotation)


def read_value(value: Any, annotation: Any, where: str) -> Any:
    """``value`` read as ``annotation`` says, at ``where``: ``Annotated[T, check, ...]`` runs each check
    first; dataclasses by `from_mapping` (item by item: "tasks[0] (MR)"), anything else by `check_value`."""
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


RUN_FACTS = ("warmup_steps_used", "data_vocab_hash", "model_config", "labels")
"""What a run's record of its settings (``OUT/run_config.json``) holds besides them: the warmup the settings
resolve to and what the run found (`bertforge.train.run.TrainingRun.run_config`). A record, under any name,
is a valid config file: these are skipped there, and any other key that is no setting is refused."""


RUN_INPUTS = "inputs"
"""The run folder's copy of data a run was given in memory (``OUT/inputs/``), which its record names."""


def follow_folder(record: Mapping[str, Any], out: str | Path) -> dict[str, Any]:
    """A run's record of its settings with the files it keeps in its run folder (data given in memory, in
    ``OUT/inputs/``) named inside ``out`` instead: a run folder moved or copied elsewhere resumes from there."""
    was = record.get("out")
    if not isinstance(was, str) or not was:
        return dict(record)
    inputs = Path(was) / RUN_INPUTS
    moved = {name: str(Path(out) / RUN_INPUTS / Path(value).relative_to(inputs)) for name, value in record.items()
             if isinstance(value, str) and value and Path(value).is_relative_to(inputs)}
    return {**record, **moved}


def config_from_file(cls: type, file: str | Path, base: Any = None) -> Any:
    """A ``cls`` config from a JSON / YAML file of its settings over ``base`` (or the named ``recipe``); a run's
    record (it holds ``warmup_steps_used``) is read without its `RUN_FACTS`, the files it names inside its
    run folder where that folder is now (`follow_folder`: the record's own folder)."""
    try:
        data = read_config_file(file)
        if "warmup_steps_used" in data:
            data = follow_folder({k: v for k, v in data.items() if k not in RUN_FACTS}, Path(file).parent)
        values = read_settings(cls, data, ints_as_floats=True)
        if base is None and "recipe" in values and hasattr(cls, "from_recipe"):  # a named recipe's settings first
            base = cls.from_recipe(values["recipe"])
        return dataclasses.replace(base, **values) if base is not None else cls(**values)
    except FieldError as e:
        raise ValueError(f"{file}: {e}") from None


# ---------------------------------------------------------------------------- devices
def check_device(device: str, *, here: bool = False) -> str:
    """``device`` if bertforge can run on it (auto, cpu, cuda, cuda:K; ``here``: on this host)."""
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

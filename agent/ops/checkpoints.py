"""How checkpoints are stored: JSON, never code.

DBOS records every workflow's inputs and every step's output or error in its system database. Its default
format is a base64 pickle, and unpickling runs whatever the bytes name: anyone who can write a row could run
code in every worker, and a DBOS console shows nothing readable. ``CheckpointSerializer`` writes JSON
instead; the project's records (Pydantic models), dataclasses, exceptions, decimals and times carry a type
tag (``"$t"``), so they come back as the same types on replay. A value of any other type is an error when
written, never a silent pickle.

Checkpoints written by a release that pickled are read through ``legacy_loads``, an unpickler that builds
only plain values and the records, dataclasses, enums and exceptions defined in this project, DBOS and
Pydantic AI: a pickle naming anything else (``os.system``, ``subprocess.Popen``) is refused, not run.
``convert_pickled_checkpoints`` (run by every migration, before DBOS launches) rewrites the pickled rows as
JSON and relabels those it cannot read, so DBOS never unpickles a row itself; a trigger relabels any pickled
row written later (by a worker of an older release, or by hand) the same way.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import functools
import importlib
import io
import json
import logging
import pickle
import uuid
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

from dbos import Serializer
from pydantic import BaseModel, TypeAdapter

log = logging.getLogger(__name__)

#: The name DBOS records with every value this serializer wrote (the system database's ``serialization``).
NAME = "refund_agent_json"
#: What DBOS's default serializer records: a base64 pickle.
PICKLE = "py_pickle"
TAG = "$t"
#: Modules whose classes a checkpoint may name: the project's own, and the libraries whose values steps return.
TRUSTED_PREFIXES = ("agent.", "steps.", "dbos.", "pydantic_ai.")
#: Plain values an old pickle may hold besides the trusted classes.
_PLAIN = {
    "builtins": {"set", "frozenset", "tuple", "list", "dict", "str", "int", "float", "bool", "bytes", "complex"},
    "decimal": {"Decimal"},
    "datetime": {"datetime", "date", "time", "timedelta", "timezone"},
    "uuid": {"UUID"},
    "collections": {"OrderedDict"},
}


class CheckpointError(Exception):
    """A checkpoint that is not this project's JSON or a pickle of trusted types: it is never run or used."""


class RecordedError(Exception):
    """A recorded exception whose class cannot be rebuilt: carries its class name and message."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name


def _trusted_module(module: str) -> bool:
    return module.startswith(TRUSTED_PREFIXES) or module == "builtins"


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


_ADAPTERS: dict[type, TypeAdapter[Any]] = {}


def _adapter(cls: type) -> TypeAdapter[Any]:
    """The dataclass's validator and serializer, built once per class: building one compiles its whole schema (tens
    of milliseconds for a model response), and every step that returns the class is written and read through it."""
    adapter = _ADAPTERS.get(cls)
    if adapter is None:
        adapter = _ADAPTERS[cls] = TypeAdapter(cls)
    return adapter


@functools.cache
def _trusted_class(name: str) -> type:
    """The class a tag names, if a checkpoint may name it: defined (not imported) in a trusted module."""
    module, _, qualname = name.partition(":")
    if not _trusted_module(module) or not qualname or "." in qualname:
        raise CheckpointError(f"checkpoint names an untrusted type {name!r}")
    found = getattr(importlib.import_module(module), qualname, None)
    if not isinstance(found, type) or found.__module__ != module:
        raise CheckpointError(f"checkpoint names {name!r}, which is not a class defined there")
    if module == "builtins" and not issubclass(found, Exception):  # not SystemExit, KeyboardInterrupt, ...
        raise CheckpointError(f"checkpoint names the builtin {name!r}, which is not an exception")
    return found


# --- writing -------------------------------------------------------------------------------------------------


def _encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and TAG not in value:
            return {k: _encode(v) for k, v in value.items()}
        return {TAG: "dict", "items": [[_encode(k), _encode(v)] for k, v in value.items()]}
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, tuple):
        return {TAG: "tuple", "items": [_encode(v) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {TAG: type(value).__name__, "items": [_encode(v) for v in value]}
    if isinstance(value, Decimal):
        return {TAG: "decimal", "value": str(value)}
    if isinstance(value, datetime):
        return {TAG: "datetime", "value": value.isoformat()}
    if isinstance(value, date):
        return {TAG: "date", "value": value.isoformat()}
    if isinstance(value, time):
        return {TAG: "time", "value": value.isoformat()}
    if isinstance(value, timedelta):
        return {TAG: "timedelta", "value": value.total_seconds()}
    if isinstance(value, timezone):
        return {TAG: "timezone", "value": value.utcoffset(None).total_seconds()}
    if isinstance(value, uuid.UUID):
        return {TAG: "uuid", "value": str(value)}
    if isinstance(value, bytes):
        return {TAG: "bytes", "value": base64.b64encode(value).decode()}
    if isinstance(value, BaseException):
        return _encode_exception(value)
    cls = type(value)
    if not _trusted_module(cls.__module__):
        raise TypeError(f"cannot checkpoint a {_class_name(cls)}: not a type of this project")
    if isinstance(value, enum.Enum):
        return {TAG: "enum", "type": _class_name(cls), "value": _encode(value.value)}
    if isinstance(value, BaseModel):
        return _readable_or_exact("model", value, value.model_dump(mode="json", round_trip=True))
    if dataclasses.is_dataclass(value):
        return _readable_or_exact("dataclass", value, _adapter(cls).dump_python(value, mode="json"))
    raise TypeError(f"cannot checkpoint a {_class_name(cls)}: not a record, dataclass or plain value")


def _readable_or_exact(tag: str, value: Any, readable: Any) -> dict[str, Any]:
    """A record as its JSON fields when they read back as the same record; else (a field typed ``Any`` holding a
    Decimal, say) each field tagged, so a replay sees exactly what the step returned."""
    encoded = {TAG: tag, "type": _class_name(type(value)), "value": readable}
    if _decode(encoded) == value:
        return encoded
    fields = (
        value.__dict__
        if isinstance(value, BaseModel)
        else {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    )
    return {TAG: tag, "type": _class_name(type(value)), "fields": {k: _encode(v) for k, v in fields.items()}}


def _encode_exception(error: BaseException) -> dict[str, Any]:
    """An error as its class, arguments and attributes; what cannot be written as JSON is left out, so recording
    a workflow's error never fails (it would leave the workflow unrecorded)."""
    args: list[Any] = []
    for arg in error.args:
        try:
            args.append(_encode(arg))
        except TypeError:
            args.append(str(arg))
    attributes = {}
    for key, attribute in vars(error).items():
        try:
            attributes[key] = _encode(attribute)
        except TypeError:
            continue
    return {TAG: "error", "type": _class_name(type(error)), "message": str(error), "args": args, "attrs": attributes}


# --- reading -------------------------------------------------------------------------------------------------


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    tag = value.get(TAG)
    if tag is None:
        return {k: _decode(v) for k, v in value.items()}
    plain = _PLAIN_DECODERS.get(tag)
    if plain is not None:
        return plain(value)
    if tag == "error":
        return _decode_exception(value)
    cls = _trusted_class(value["type"])
    if tag == "enum" and issubclass(cls, enum.Enum):
        return cls(_decode(value["value"]))
    fields = value["value"] if "value" in value else {k: _decode(v) for k, v in value["fields"].items()}
    if tag == "model" and issubclass(cls, BaseModel):
        return cls.model_validate(fields)
    if tag == "dataclass" and dataclasses.is_dataclass(cls):
        return _adapter(cls).validate_python(fields)
    raise CheckpointError(f"checkpoint tag {tag!r} does not fit {value['type']!r}")


_PLAIN_DECODERS: dict[str, Any] = {
    "dict": lambda v: {_decode(k): _decode(x) for k, x in v["items"]},
    "tuple": lambda v: tuple(_decode(x) for x in v["items"]),
    "set": lambda v: {_decode(x) for x in v["items"]},
    "frozenset": lambda v: frozenset(_decode(x) for x in v["items"]),
    "decimal": lambda v: Decimal(v["value"]),
    "datetime": lambda v: datetime.fromisoformat(v["value"]),
    "date": lambda v: date.fromisoformat(v["value"]),
    "time": lambda v: time.fromisoformat(v["value"]),
    "timedelta": lambda v: timedelta(seconds=v["value"]),
    "timezone": lambda v: timezone(timedelta(seconds=v["value"])),
    "uuid": lambda v: uuid.UUID(v["value"]),
    "bytes": lambda v: base64.b64decode(v["value"]),
}


def _decode_exception(value: dict[str, Any]) -> BaseException:
    try:
        cls = _trusted_class(value["type"])
    except (CheckpointError, ImportError):
        return RecordedError(value["type"], value["message"])
    if not issubclass(cls, BaseException):
        raise CheckpointError(f"checkpoint error names {value['type']!r}, which is not an exception")
    # Built as unpickling builds it: no __init__ (whose signature may differ), then its arguments and attributes.
    error = cls.__new__(cls)
    error.args = tuple(_decode(a) for a in value["args"])
    for key, attribute in value["attrs"].items():
        try:
            setattr(error, key, _decode(attribute))
        except (AttributeError, TypeError, CheckpointError):
            continue
    return error


class _TrustedUnpickler(pickle.Unpickler):
    """Builds plain values and trusted classes only; any other global a pickle names is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if name in _PLAIN.get(module, ()):
            return super().find_class(module, name)
        if module.startswith(TRUSTED_PREFIXES) or (module == "builtins" and "." not in name):
            cls = _trusted_class(f"{module}:{name}")
            if issubclass(cls, (BaseModel, enum.Enum, BaseException)) or dataclasses.is_dataclass(cls):
                return cls
        raise CheckpointError(f"refused to unpickle {module}.{name}: not a type a checkpoint may hold")


def legacy_loads(text: str) -> Any:
    """A checkpoint a pickling release wrote (base64), read with trusted types only."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise CheckpointError("checkpoint is neither JSON nor a base64 pickle") from e
    try:
        return _TrustedUnpickler(io.BytesIO(raw)).load()
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"old pickled checkpoint cannot be read: {e}") from e


class CheckpointSerializer(Serializer):
    """DBOS's serializer for this project: tagged JSON out; JSON or a trusted old pickle in."""

    def name(self) -> str:
        return NAME

    def serialize(self, data: Any) -> str:
        return json.dumps(_encode(data), separators=(",", ":"), ensure_ascii=False)

    def deserialize(self, serialized_data: str) -> Any:
        try:
            data = json.loads(serialized_data)
        except ValueError:  # base64 is never JSON: a pickle an older release wrote
            return legacy_loads(serialized_data)
        return _decode(data)


SERIALIZER = CheckpointSerializer()

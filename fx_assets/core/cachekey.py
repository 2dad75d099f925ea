"""Cache keys of derived files: complete by construction (DESIGN.md §5.3).

Owns the one derivation of the key that every derived file carries in its name and header.
The key is the SHA-256 of a canonical JSON document built from

- every config model that influences the output, *from the models themselves*: each model
  contributes its fully-qualified class name and every field, recursively (nested models
  likewise), so a parameter added to a config model is in the key without anyone having to
  remember it (the predecessor's keys forgot bar threshold, EWMA alpha and bar size);
- the identity of every source file (path, size, hash of its whole content);
- the keys of the derived files it was built from (so keys chain: a stage's key covers what
  its upstream files were built from without listing it again) and any other settings that
  shape it (``extras``, e.g. the device loader's of a trained model);
- the file format version and the producing code version.

Canonical JSON: sorted keys, no whitespace, floats by ``repr`` (Python's ``json`` does that),
tuples as lists, enums by value. ``hash()`` is never used, so keys are the same in every
process and on every machine.

Also here: ``config_fields`` / ``mutate_field_value`` / ``replace_field``, the introspection
that lets a test change every field of a config model in turn and check that the key moves.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
import pydantic
import pydantic_core
from pydantic.fields import FieldInfo

KEY_BYTES = 32


@dataclass(frozen=True)
class SourceIdentity:
    """Identity of one source file, as recorded in keys: its resolved path, size and the
    XXH3-128 hash of its whole content (``"xxh3-128:<hex>"``, :mod:`fx_assets.core.checksum`).

    The modification time is not part of it: a ``touch`` changes nothing that was computed
    from the file, while any change of a byte does (see :mod:`fx_assets.core.source_hash`).
    """

    path: str
    size: int
    content_hash: str

    @classmethod
    def from_path(
        cls,
        path: Path | str,
        *,
        content_hash: str | None = None,
        record_dir: Path | str | None = None,
    ) -> SourceIdentity:
        """Stat ``path`` and take its content hash: ``content_hash`` if given, else the one
        recorded in ``record_dir`` for the current stat, else hashed now (and recorded there)."""
        from fx_assets.core.source_hash import content_hash as current_hash

        p = Path(path).resolve()
        st = os.stat(p)
        if content_hash is None:
            content_hash = current_hash(p, record_dir)
        return cls(path=str(p), size=int(st.st_size), content_hash=content_hash)


# --- canonical form -------------------------------------------------------------------------


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _canon(value: Any) -> Any:
    """JSON-ready canonical form; models carry their class name so two models never collide."""
    if isinstance(value, pydantic.BaseModel):
        cls = type(value)
        fields = {name: _canon(getattr(value, name)) for name in cls.model_fields}
        if value.model_extra:
            fields.update({f"extra:{k}": _canon(v) for k, v in value.model_extra.items()})
        return {"__model__": qualified_name(cls), "fields": fields}
    if isinstance(value, enum.Enum):
        return {"__enum__": qualified_name(type(value)), "value": _canon(value.value)}
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        # json writes floats by repr; NaN/inf have no JSON form, so spell them out.
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, tuple | list):
        return [_canon(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _canon(v) for k, v in value.items()}
    if isinstance(value, frozenset | set):
        return sorted((_canon(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    # dates, paths, decimals, ...: pydantic's own JSON form of the value.
    return _canon(pydantic_core.to_jsonable_python(value))


def canonical_value(value: Any) -> Any:
    """The JSON-ready canonical form of a value as keys record it (models by class and field)."""
    return _canon(value)


def canonical_json(obj: Any) -> str:
    return json.dumps(_canon(obj), sort_keys=True, separators=(",", ":"), allow_nan=False)


def cache_key(
    *,
    configs: Sequence[pydantic.BaseModel],
    sources: Sequence[SourceIdentity],
    format_version: int,
    code_version: str,
    inputs: Sequence[str] = (),
    extras: Mapping[str, Any] | None = None,
) -> bytes:
    """32-byte SHA-256 key of a derived file (order of ``configs`` / ``sources`` / ``inputs``
    matters). ``inputs``: the keys of the derived files it was built from (each covering its own
    inputs: keys chain); ``extras``: other settings that shape it (canonicalised like configs)."""
    for c in configs:
        if not isinstance(c, pydantic.BaseModel):
            raise TypeError(f"cache_key: configs must be pydantic models, got {type(c).__name__}")
    for k in inputs:
        if not isinstance(k, str) or not k:
            raise TypeError(f"cache_key: inputs must be non-empty key strings, got {k!r}")
    doc = {
        "configs": [_canon(c) for c in configs],
        "sources": [asdict(s) for s in sources],
        "inputs": list(inputs),
        "extras": _canon(dict(extras or {})),
        "format_version": int(format_version),
        "code_version": str(code_version),
    }
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).digest()


def hexkey(key: bytes, length: int = 16) -> str:
    """The first ``length`` hex digits of a key, for file names (16 = 64 bits, plenty)."""
    if len(key) != KEY_BYTES:
        raise ValueError(f"cache key must be {KEY_BYTES} bytes, got {len(key)}")
    return key.hex()[:length]


def keyed_name(stem: str, key: bytes, suffix: str) -> str:
    """``{stem}_{hexkey}{suffix}``: files of different parameter sets coexist in one directory."""
    return f"{stem}_{hexkey(key)}{suffix}"


# --- introspection for the completeness test -------------------------------------------------


def _unwrap_optional(annotation: Any) -> Any:
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _model_class(annotation: Any) -> type[pydantic.BaseModel] | None:
    ann = _unwrap_optional(annotation)
    if isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        return ann
    return None


def config_fields(model_cls: type[pydantic.BaseModel]) -> list[str]:
    """Dotted paths of every leaf field (nested models are walked, not listed themselves)."""
    out: list[str] = []
    for name, info in model_cls.model_fields.items():
        sub = _model_class(info.annotation)
        if sub is not None:
            out.extend(f"{name}.{p}" for p in config_fields(sub))
        else:
            out.append(name)
    return out


def field_info_at(model_cls: type[pydantic.BaseModel], dotted: str) -> FieldInfo:
    head, _, rest = dotted.partition(".")
    info = model_cls.model_fields[head]
    if not rest:
        return info
    sub = _model_class(info.annotation)
    if sub is None:
        raise KeyError(f"{qualified_name(model_cls)}.{head} is not a model; cannot descend to {rest}")
    return field_info_at(sub, rest)


def get_field(model: pydantic.BaseModel, dotted: str) -> Any:
    value: Any = model
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def replace_field(model: pydantic.BaseModel, dotted: str, value: Any) -> pydantic.BaseModel:
    """A validated copy of ``model`` with the field at ``dotted`` set to ``value``."""
    head, _, rest = dotted.partition(".")
    if rest:
        value = replace_field(getattr(model, head), rest, value)
    data = {name: getattr(model, name) for name in type(model).model_fields}
    data[head] = value
    return type(model).model_validate(data)


def _bounds(info_metadata: Sequence[Any]) -> tuple[float, float, bool, bool]:
    lo, hi, lo_open, hi_open = -math.inf, math.inf, False, False
    for m in info_metadata:
        if isinstance(m, annotated_types.Ge):
            lo = float(m.ge)  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Gt):
            lo, lo_open = float(m.gt), True  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Le):
            hi = float(m.le)  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Lt):
            hi, hi_open = float(m.lt), True  # type: ignore[arg-type]
        elif isinstance(m, annotated_types.Interval):
            if m.ge is not None:
                lo = float(m.ge)  # type: ignore[arg-type]
            if m.gt is not None:
                lo, lo_open = float(m.gt), True  # type: ignore[arg-type]
            if m.le is not None:
                hi = float(m.le)  # type: ignore[arg-type]
            if m.lt is not None:
                hi, hi_open = float(m.lt), True  # type: ignore[arg-type]
    return lo, hi, lo_open, hi_open


def _in_bounds(x: float, b: tuple[float, float, bool, bool]) -> bool:
    lo, hi, lo_open, hi_open = b
    return (x > lo if lo_open else x >= lo) and (x < hi if hi_open else x <= hi)


def _candidates(value: Any, annotation: Any, metadata: Sequence[Any]) -> Iterator[Any]:
    """Values of the annotated type different from ``value``, best first."""
    ann = _unwrap_optional(annotation)
    origin = get_origin(ann)
    if origin is typing.Annotated:
        base, *extra = get_args(ann)
        yield from _candidates(value, base, [*metadata, *extra])
        return
    b = _bounds(metadata)
    if value is None:  # an Optional field left at None: any value of the inner type differs
        yield from _fresh_values(ann, b)
        return
    if origin is Literal:
        yield from (c for c in get_args(ann) if c != value or type(c) is not type(value))
    elif isinstance(ann, type) and issubclass(ann, enum.Enum):
        yield from (m for m in ann if m != value)
    elif ann is bool:
        yield not value
    elif ann is int:
        for c in (value + 1, value - 1, value * 2, value + 7):
            if c != value and _in_bounds(c, b):
                yield c
    elif ann is float:
        for c in (value * 1.5 + 0.25, value + 1.0, value * 0.5, value - 1.0, value * 0.9, value + 1e-3):
            if c != value and _in_bounds(c, b):
                yield c
        lo, hi, _, _ = b
        if math.isfinite(lo) and math.isfinite(hi):
            mid = (lo + hi) / 2.0
            if mid != value:
                yield mid
    elif ann is str:
        yield value + "_x"
        yield "x"
    elif isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        # Change the nested model's first mutable leaf.
        for path in config_fields(ann):
            info = field_info_at(ann, path)
            for c in _candidates(get_field(value, path), info.annotation, info.metadata):
                try:
                    yield replace_field(value, path, c)
                except pydantic.ValidationError:
                    continue
                return
    elif origin is tuple or ann is tuple:
        args = get_args(ann)
        items = tuple(value)
        if args and len(args) == 2 and args[1] is Ellipsis:
            elem = args[0]
            if items:
                for c in _candidates(items[0], elem, ()):
                    yield (c, *items[1:])
                yield items[:-1]
            yield (*items, *items[-1:]) if items else ()
        elif args:
            for i, elem in enumerate(args):
                for c in _candidates(items[i], elem, ()):
                    yield (*items[:i], c, *items[i + 1 :])
    elif origin is list or ann is list:
        # Dagster config has no tuples, so stage configs use lists: mutate like a variable tuple.
        largs = get_args(ann)
        litems = list(value)
        if litems:
            for c in _candidates(litems[0], largs[0] if largs else type(litems[0]), ()):
                yield [c, *litems[1:]]
            yield litems[:-1]
            yield [*litems, litems[-1]]
    else:
        raise TypeError(f"mutate_field_value: unsupported field type {ann!r}")


def _fresh_values(ann: Any, b: tuple[float, float, bool, bool]) -> Iterator[Any]:
    if get_origin(ann) is Literal:
        yield from get_args(ann)
    elif isinstance(ann, type) and issubclass(ann, enum.Enum):
        yield from ann
    elif ann is bool:
        yield True
    elif ann in (int, float):
        lo, hi, _, _ = b
        # the midpoint last: an open float interval such as (0, 1) admits none of the others
        for c in (1, 0, 2, lo + 1, hi - 1, (lo + hi) / 2 if ann is float else lo + 1):
            if math.isfinite(c) and _in_bounds(c, b):
                yield ann(c)
    elif ann is str:
        yield "x"
    elif isinstance(ann, type) and issubclass(ann, pydantic.BaseModel):
        yield ann()
    elif get_origin(ann) in (list, tuple):
        args = [a for a in get_args(ann) if a is not Ellipsis]
        for elem in _fresh_values(args[0], b) if args else iter(()):
            yield [elem] if get_origin(ann) is list else (elem,)
    else:
        raise TypeError(f"mutate_field_value: cannot make a value for None of type {ann!r}")


def mutate_field_value(value: Any, field_info: FieldInfo) -> Iterator[Any]:
    """Yield values different from ``value`` for a field of the given type, best first.

    The caller keeps the first one its model accepts (``replace_field`` validates), which
    handles range constraints and cross-field validators the type alone does not show.
    Supports int, float, bool, str, Literal, Enum, tuples (fixed or variadic), nested models,
    ``Optional`` of those (for a non-None value) and ``Annotated`` constraints.
    """
    yielded = False
    for c in _candidates(value, field_info.annotation, field_info.metadata):
        if c == value and type(c) is type(value):
            continue
        yielded = True
        yield c
    if not yielded:
        raise TypeError(f"mutate_field_value: no alternative value for {value!r} ({field_info.annotation!r})")

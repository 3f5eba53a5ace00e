"""Schema drift: the rule that gives a column one type when files disagree on it.

Pure functions of Arrow types and of the footers' schemas, decided once at
planning (docs/types.md, "Schema drift"). Only widening that keeps every value
exactly is promoted; anything else stays a `SchemaMismatchError` naming two
files, their types and the fix.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ._types import column_spec
from .errors import DetloadError, SchemaMismatchError

__all__ = ["ColumnDrift", "column_drift", "promote", "same_form", "zone_mix"]


def _form(t: pa.DataType) -> str:
    # Two types are one column if they deliver the same NumPy form (string and
    # large_string, a dictionary and its values, INT96 and timestamp[us]); types detload
    # does not map compare by their Arrow text.
    try:
        s = column_spec("_", t)
    except DetloadError:
        return "arrow:" + str(t)
    key = f"{s.kind}:{s.dtype}:{s.inner}:{s.ragged_kind}"
    return key if s.item_kind is None else f"{key}:{s.item_kind}"


def same_form(a: pa.DataType, b: pa.DataType) -> bool:
    """Whether ``a`` and ``b`` deliver the same NumPy form (so they are not drift)."""
    return a.equals(b) or _form(a) == _form(b)


def _value(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _var_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def promote(types: Sequence[pa.DataType]) -> pa.DataType | None:
    """The one type every type of ``types`` widens to without losing a value, or None.

    Decided on the set of types, so the answer does not depend on their order:

    - integers of one signedness: the widest; signed and unsigned: the narrowest
      signed type wider than every unsigned one (uint64 with any signed: None);
    - floats: the widest; integers with floats: float64 when no integer is wider
      than 32 bits (int64 and uint64 do not fit a float64 exactly: None);
    - lists and large lists: a list of the elements' promotion (a large list if
      any is large); fixed-size lists of one size likewise;
    - decimals: the narrowest decimal with the largest scale and the most integer digits
      of them all (decimal256 beyond 38 digits, None beyond 76);
    - a ``null`` column (all nulls) takes the others' type;
    - types of the same NumPy form are one type; anything else: None.
    """
    if not types:
        return None
    first = types[0]
    if all(same_form(first, t) for t in types[1:]):
        return first
    plain = [_value(t) for t in types]
    typed = [t for t in plain if not pa.types.is_null(t)]
    if len(typed) < len(plain):
        return promote(typed) if typed else first
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in typed):
        return _numeric(typed)
    if all(pa.types.is_decimal(t) for t in typed):
        return _decimal(typed)
    if all(_var_list(t) for t in typed):
        inner = promote([t.value_type for t in typed])
        if inner is None:
            return None
        item = typed[0].value_field.with_type(inner).with_nullable(True)  # the writers' item name
        return pa.large_list(item) if any(pa.types.is_large_list(t) for t in typed) else pa.list_(item)
    if all(pa.types.is_fixed_size_list(t) for t in typed) and len({t.list_size for t in typed}) == 1:
        inner = promote([t.value_type for t in typed])
        return None if inner is None else pa.list_(typed[0].value_field.with_type(inner).with_nullable(True),
                                                   typed[0].list_size)
    return None


_SIGNED = {8: pa.int8(), 16: pa.int16(), 32: pa.int32(), 64: pa.int64()}
_UNSIGNED = {8: pa.uint8(), 16: pa.uint16(), 32: pa.uint32(), 64: pa.uint64()}
_FLOATS = {16: pa.float16(), 32: pa.float32(), 64: pa.float64()}


def _numeric(types: Sequence[pa.DataType]) -> pa.DataType | None:
    ints = [t for t in types if pa.types.is_integer(t)]
    floats = [t for t in types if pa.types.is_floating(t)]
    if floats:
        if not ints:
            return _FLOATS[max(t.bit_width for t in floats)]
        # float64 holds every integer up to 2**53 exactly: 32-bit integers, not 64-bit ones.
        return pa.float64() if max(t.bit_width for t in ints) <= 32 else None
    signed = max((t.bit_width for t in ints if pa.types.is_signed_integer(t)), default=0)
    unsigned = max((t.bit_width for t in ints if pa.types.is_unsigned_integer(t)), default=0)
    if not signed:
        return _UNSIGNED[unsigned]
    if not unsigned:
        return _SIGNED[signed]
    width = max(signed, 2 * unsigned)  # a signed type holds an unsigned one of half its width
    return _SIGNED.get(width)


def _decimal(types: Sequence[pa.DataType]) -> pa.DataType | None:
    scale = max(t.scale for t in types)
    digits = max(t.precision - t.scale for t in types) + scale  # every integer digit, every fraction digit
    if digits <= 38 and not any(pa.types.is_decimal256(t) for t in types):
        return pa.decimal128(digits, scale)
    return pa.decimal256(digits, scale) if digits <= 76 else None


@dataclass(frozen=True)
class ColumnDrift:
    """How the files with rows type one column, when they disagree or some lack it.

    ``types``: each type as written, with how many files hold it and the first of them
    (canonical order, first seen first); ``missing``: the files that lack the column;
    ``promoted``: the type every file is read as, None when the rule refuses.
    """

    name: str
    types: tuple[tuple[pa.DataType, int, str], ...]
    missing: tuple[str, ...]
    promoted: pa.DataType | None

    @property
    def retyped(self) -> bool:
        """Whether some file's values are converted (not only filled in)."""
        return len({_form(t) for t, _, _ in self.types}) > 1

    def record(self) -> dict[str, Any]:
        """The order's record of this column (JSON): what was delivered and from what."""
        out: dict[str, Any] = {"type": str(self.promoted),
                               "from": {str(t): n for t, n, _ in self.types}}
        if self.missing:
            out["missing_files"] = len(self.missing)
        return out

    def describe(self) -> str:
        """``"int32 in 2 files, int64 in 1 file -> int64"`` (inspect's line)."""
        seen = [f"{t} in {n} file{'s' if n != 1 else ''}" for t, n, _ in self.types]
        if self.missing:
            seen.append(f"missing from {len(self.missing)} file{'s' if len(self.missing) != 1 else ''}")
        to = str(self.promoted) if self.promoted is not None else "refused (no widening holds every value)"
        return ", ".join(seen) + f" -> {to}"

    def refusal(self) -> SchemaMismatchError:
        """The error for a drift the rule refuses: two files, both types and the fixes."""
        assert self.promoted is None
        pair = next(((a, b) for i, a in enumerate(self.types) for b in self.types[i + 1:]
                     if promote([a[0], b[0]]) is None), (self.types[0], self.types[-1]))
        (ta, _, fa), (tb, _, fb) = pair
        return SchemaMismatchError(
            f"schema drift between {fa} and {fb}: {self.name!r} is {ta} in {fa} but {tb} in {fb}, and no "
            "type holds both without changing a value (detload promotes only widening integers, "
            "floats and decimals, and lists of them: docs/types.md, \"Schema drift\"). Leave the column out with "
            "columns=[...], or rewrite the files of one type with the other (e.g. pyarrow's "
            "Table.cast, where every value fits); cast= converts the promoted type, so it cannot unify "
            "types that do not promote."
        )

    def lacked_error(self, use: str, why: str, instead: str) -> SchemaMismatchError:
        """The error for a use of a column's stored values (a filter, a group key, the mixing
        report) where some files lack the column: the value a fill delivers is not stored.
        ``use`` names it ("the filter reads column"), ``instead`` begins the fix ("Filter on")."""
        n = len(self.missing)
        return SchemaMismatchError(
            f"{use} {self.name!r}, which {n} file{'s lack' if n != 1 else ' lacks'}, e.g. {self.missing[0]} "
            f"({self.types[0][2]} has it): {why}. {instead} a column every file holds, or rewrite the "
            "files that lack it"
        )

    def missing_error(self) -> SchemaMismatchError:
        """The error for a column some files lack, loaded without a fill."""
        t, _, has = self.types[0]
        n = len(self.missing)
        return SchemaMismatchError(
            f"column {self.name!r} is missing from {n} file{'s' if n != 1 else ''}, e.g. {self.missing[0]}, "
            f"but {has} has it ({t}). Pass null_fill={{{self.name!r}: value}} to fill every row of the "
            f"files that lack it with that value (on the command line: --null-fill {self.name}=VALUE), "
            "or leave the column out with columns=[...]."
        )


def column_drift(name: str, groups: Sequence[tuple[pa.Schema, Sequence[str]]]) -> ColumnDrift | None:
    """The drift of column ``name`` over the files with rows, given as their distinct
    ``groups`` (schema, the files holding it in canonical order), first seen first; None when
    every file holds the column in one form (the common case)."""
    seen: dict[str, list[Any]] = {}
    missing: list[str] = []
    for schema, paths in groups:
        i = schema.get_field_index(name)
        if i < 0:
            missing.extend(paths)
            continue
        t = schema.field(i).type
        entry = seen.setdefault(str(t), [t, 0, paths[0]])
        entry[1] += len(paths)
    if not seen:
        return None
    types = tuple((t, n, p) for t, n, p in seen.values())
    if not missing and all(same_form(types[0][0], t) for t, _, _ in types[1:]):
        return None
    return ColumnDrift(name, types, tuple(missing), promote([t for t, _, _ in types]))


def _zone(t: pa.DataType) -> str | None:
    """The time zone of a timestamp type (or of a list's or a dictionary's timestamps), "" for
    a timestamp without one, None for any other type."""
    t = _value(t)
    while _var_list(t) or pa.types.is_fixed_size_list(t):
        t = t.value_type
    return (t.tz or "") if pa.types.is_timestamp(t) else None


def zone_mix(name: str, groups: Sequence[tuple[pa.Schema, Sequence[str]]],
             int96: Collection[str] = ()) -> str | None:
    """A warning text when column ``name`` is a timestamp with a time zone in some files and
    without one in others (``groups`` as for `column_drift`), else None. The files of
    ``int96`` store it as Parquet INT96, typed without a zone; they count as neither: Spark
    writes UTC instants there, Impala and Hive local times, and nothing in the file says which.

    Both read as the same dtype (docs/types.md): a zoned file's values are the UTC instants
    Arrow stores, a zone-less file's are the values as written. They agree only if the
    zone-less files hold UTC times; local wall-clock times are then off by the zone's offset
    in a way no value shows. Zones that differ between zoned files are not warned about:
    every zoned value is a UTC instant."""
    zoned: tuple[str, str] | None = None
    naive: str | None = None
    for schema, paths in groups:
        i = schema.get_field_index(name)
        if i < 0 or not paths:
            continue
        zone = _zone(schema.field(i).type)
        if zone is None:
            continue
        if zone:
            zoned = zoned or (zone, paths[0])
            continue
        naive = naive or next((p for p in paths if p not in int96), None)
    if zoned is None or naive is None:
        return None
    zone, with_zone = zoned
    return (
        f"column {name!r} has time zone {zone} in {with_zone} but no time zone in {naive}: detload delivers "
        f"both as datetime64 without a zone, {with_zone}'s values as UTC instants and {naive}'s as written, "
        "which agree only if the files without a zone hold UTC times (a local time is off by the zone's "
        "offset). Rewrite the files without a zone with one (pyarrow.compute.assume_timezone for local "
        f"times, Table.cast to timestamp[unit, tz=UTC] for UTC ones), or leave {name!r} out with "
        "columns=[...]. Once checked, silence it with "
        "warnings.filterwarnings('ignore', category=detload.TimeZoneWarning)."
    )

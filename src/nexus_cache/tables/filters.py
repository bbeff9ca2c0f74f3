"""Row filters in pyarrow's ``filters`` convention, validated and made canonical.

A filter is a list of ``(column, op, value)`` predicates (all must hold), or a
list of such lists (any list may hold): the form ``pyarrow.parquet.read_table``,
pandas and Dask accept. ``op`` is one of ``=``, ``==``, ``!=``, ``<``, ``<=``,
``>``, ``>=``, ``in``, ``not in``; a value is a JSON scalar, or a list for
``in`` / ``not in``, so a filter travels through JSON unchanged (tuples come
back as lists, which are read the same).

:func:`canonical_filter` checks a filter against a table's schema before any
byte is read (:class:`~nexus_cache.errors.ConfigError` naming the predicate)
and returns a :class:`TableFilter`: values cast to the column's type,
predicates and clauses sorted, ``==`` written ``=``; its :attr:`~TableFilter.key`
is the same text for every spelling of the same filter. Null semantics are
pyarrow's: a null satisfies no comparison; ``in`` holds for a null only when
the list holds one, and ``not in`` holds for a null unless it does.

:func:`parse_filter_arg` reads the command line's ``--filter EXPR``.
Pure functions; thread-safe.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import pyarrow as pa
import pyarrow.types as pat

from nexus_cache._lru import BoundedLRU
from nexus_cache.errors import ConfigError

__all__ = [
    "COMPARISON_OPS",
    "MAX_IN_VALUES",
    "OPS",
    "Predicate",
    "TableFilter",
    "canonical_filter",
    "filter_type_problem",
    "parse_filter_arg",
]

#: the comparison operators (``==`` is read as ``=``)
COMPARISON_OPS = ("=", "!=", "<", "<=", ">", ">=")
#: every operator a predicate may use
OPS = (*COMPARISON_OPS, "==", "in", "not in")
#: the most values one ``in`` / ``not in`` list may hold
MAX_IN_VALUES = 100_000

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_DATE_EPOCH = _dt.date(1970, 1, 1)
_UNIT_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}
# the fraction of a second in ISO 8601 text (Python's datetime keeps 6 digits of it)
_SECOND_FRACTION = re.compile(r"(?<=\d)[.,](\d+)")


@dataclass(frozen=True, order=True)
class Predicate:
    """One ``column op value`` test, canonical: ``op`` never ``==``; ``value`` typed
    for the column (a timestamp as an int in the column's unit, a date as days
    since 1970-01-01), a sorted tuple for ``in`` / ``not in`` (``None`` last)."""

    column: str
    op: str
    value: Any

    def to_json(self) -> list[Any]:
        value = list(self.value) if isinstance(self.value, tuple) else self.value
        return [self.column, self.op, value]


@dataclass(frozen=True)
class TableFilter:
    """A canonical filter: an OR of ANDs of :class:`Predicate` (both levels sorted,
    without repeats), typed for ``schema``'s columns. Immutable: its columns, key
    and digest are computed once, when first read."""

    clauses: tuple[tuple[Predicate, ...], ...]
    schema: pa.Schema

    @functools.cached_property
    def columns(self) -> tuple[str, ...]:
        """The columns the filter reads, sorted."""
        return tuple(sorted({p.column for clause in self.clauses for p in clause}))

    @functools.cached_property
    def column_types(self) -> Mapping[str, pa.DataType]:
        """Each column the filter reads and its type in ``schema``."""
        return MappingProxyType({n: self.schema.field(n).type for n in self.columns})

    @functools.cached_property
    def converters(self) -> Mapping[str, Callable[[Any], Any]]:
        """Each column the filter reads and the function that makes a value found in a
        table's metadata or a footer canonical for its type (None: it cannot be one)."""
        return MappingProxyType({n: _canonical_of(t) for n, t in self.column_types.items()})

    def to_json(self) -> list[list[list[Any]]]:
        """The canonical filter as JSON lists (OR of ANDs); :func:`canonical_filter`
        of it gives this filter again."""
        return [[p.to_json() for p in clause] for clause in self.clauses]

    @functools.cached_property
    def key(self) -> str:
        """Compact JSON of :meth:`to_json`: the same text for every spelling of one filter."""
        return json.dumps(self.to_json(), separators=(",", ":"), ensure_ascii=True)

    @functools.cached_property
    def digest(self) -> str:
        """SHA-256 (hex) of :attr:`key`, for cache keys and evidence."""
        return hashlib.sha256(self.key.encode("ascii")).hexdigest()

    def to_expression(self) -> Any:
        """The filter as a ``pyarrow.compute.Expression`` with the same meaning."""
        import pyarrow.compute as pc

        any_of = None
        for clause in self.clauses:
            all_of = None
            for p in clause:
                term = _expression(pc, p, self.schema.field(p.column).type)
                all_of = term if all_of is None else all_of & term
            any_of = all_of if any_of is None else any_of | all_of
        return any_of


def _expression(pc: Any, p: Predicate, arrow_type: pa.DataType) -> Any:
    field = pc.field(p.column)
    if p.op in ("in", "not in"):
        values = pa.array(list(p.value), type=_value_type(arrow_type))
        found = field.isin(values)
        return found if p.op == "in" else ~found
    scalar = pa.scalar(p.value, type=_value_type(arrow_type))
    if pat.is_timestamp(arrow_type) or pat.is_date(arrow_type):
        scalar = scalar.cast(arrow_type)
    return {
        "=": field == scalar,
        "!=": field != scalar,
        "<": field < scalar,
        "<=": field <= scalar,
        ">": field > scalar,
        ">=": field >= scalar,
    }[p.op]


def _value_type(arrow_type: pa.DataType) -> pa.DataType:
    """The Arrow type a canonical value is written in for ``arrow_type``."""
    if pat.is_dictionary(arrow_type):
        return _value_type(arrow_type.value_type)
    if pat.is_timestamp(arrow_type):
        return pa.int64()
    if pat.is_date(arrow_type):
        return pa.int32()
    return arrow_type


def filter_type_problem(arrow_type: pa.DataType) -> str | None:
    """Why a column of ``arrow_type`` cannot be filtered, or None when it can."""
    base = arrow_type.value_type if pat.is_dictionary(arrow_type) else arrow_type
    if (
        pat.is_integer(base)
        or pat.is_floating(base)
        or pat.is_boolean(base)
        or pat.is_string(base)
        or pat.is_large_string(base)
        or pat.is_timestamp(base)
        or pat.is_date32(base)
    ):
        return None
    return (
        f"its type {arrow_type} cannot be filtered (ints, floats, booleans, strings, "
        "timestamps and date32 can)"
    )


def _shown(raw: Any) -> str:
    try:
        return json.dumps(raw, default=str)[:200]
    except (TypeError, ValueError):
        return repr(raw)[:200]


def _refuse(raw: Any, why: str) -> ConfigError:
    return ConfigError(f"filter {_shown(raw)}: {why}")


def _is_predicate(item: Any) -> bool:
    return isinstance(item, (list, tuple)) and len(item) >= 1 and isinstance(item[0], str)


#: canonical filters by the exact text of the plain filter they were made of (see
#: :func:`_plain_text`), with the schema they were made for: a repeated query's
#: filter is not checked and typed again
_CANONICAL: BoundedLRU[str, TableFilter] = BoundedLRU(256)
#: the most lists and values a filter remembered by :data:`_CANONICAL` holds
_REMEMBERED_ITEMS = 1024
_PLAIN_SCALARS = frozenset({str, int, float, bool, type(None)})


def _plain_text(filters: Any) -> str | None:
    """A text naming ``filters`` exactly, each value with its type (``repr`` of lists
    and tuples of ``str``, ``int``, ``float``, ``bool`` and ``None`` alone, of these
    exact types: ``1``, ``1.0``, ``True`` and ``'1'`` differ); None for anything
    else, or more than :data:`_REMEMBERED_ITEMS` items."""
    items = 0
    pending = [filters]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is list or kind is tuple:
            items += len(item) + 1
            if items > _REMEMBERED_ITEMS:
                return None
            pending.extend(item)
        elif kind not in _PLAIN_SCALARS:
            return None
    return repr(filters)


def canonical_filter(filters: Any, schema: pa.Schema) -> TableFilter | None:
    """``filters`` (pyarrow's convention, or a :class:`TableFilter`) checked against
    ``schema`` and made canonical; None for no filter (``None``).

    :class:`ConfigError` naming the predicate for an unknown column or operator,
    a value the column's type cannot be compared with, or a malformed filter.
    A filter of plain values made canonical for an equal schema before is the
    one made then (:data:`_CANONICAL`; a refused one is checked again).
    """
    if filters is None:
        return None
    if isinstance(filters, TableFilter):
        filters = filters.to_json()
    text = _plain_text(filters)
    if text is not None:
        known = _CANONICAL.get(text)
        if known is not None and (
            known.schema is schema or known.schema.equals(schema, check_metadata=True)
        ):
            return known
    made = _canonical(filters, schema)
    if text is not None:
        _CANONICAL.put(text, made)
    return made


def _canonical(filters: Any, schema: pa.Schema) -> TableFilter:
    """:func:`canonical_filter` of a filter that is not None, made now."""
    if isinstance(filters, (str, bytes)) or not isinstance(filters, (list, tuple)):
        raise _refuse(
            filters,
            "is not a list of (column, op, value) predicates or a list of such lists",
        )
    if not filters:
        raise _refuse(filters, "is empty; pass None for no filter")
    if all(_is_predicate(item) for item in filters):
        raw_clauses: Sequence[Any] = [filters]
    elif all(isinstance(item, (list, tuple)) and not _is_predicate(item) for item in filters):
        raw_clauses = filters
    else:
        raise _refuse(
            filters,
            "mixes predicates and lists of predicates; write a list of (column, op, value) "
            "predicates (AND), or a list of such lists (OR of ANDs)",
        )
    clauses: set[tuple[Predicate, ...]] = set()
    for raw_clause in raw_clauses:
        if not raw_clause:
            raise _refuse(filters, "holds an empty list of predicates")
        for item in raw_clause:
            if not _is_predicate(item):
                raise _refuse(item, "is not a (column, op, value) predicate")
        clause = tuple(sorted({_predicate(item, schema) for item in raw_clause}, key=_sort_key))
        clauses.add(clause)
    ordered = tuple(sorted(clauses, key=lambda c: [_sort_key(p) for p in c]))
    return TableFilter(ordered, schema)


def _sort_key(p: Predicate) -> tuple[str, str, str]:
    return (p.column, p.op, json.dumps(p.to_json()[2]))


def _predicate(item: Sequence[Any], schema: pa.Schema) -> Predicate:
    if len(item) != 3:
        raise _refuse(list(item), "is not a (column, op, value) predicate of three items")
    column, op, value = item
    if not isinstance(op, str) or op not in OPS:
        raise _refuse(list(item), f"unknown operator {op!r}; use one of {', '.join(OPS)}")
    op = "=" if op == "==" else op
    index = schema.get_field_index(column)
    if index < 0:
        names = ", ".join(schema.names[:20])
        raise _refuse(list(item), f"the table has no column {column!r} (its columns: {names})")
    arrow_type = schema.field(index).type
    problem = filter_type_problem(arrow_type)
    if problem is not None:
        raise _refuse(list(item), f"column {column!r}: {problem}")
    if op in ("in", "not in"):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise _refuse(list(item), f"{op!r} takes a list of values")
        if len(value) > MAX_IN_VALUES:
            raise _refuse(
                [column, op, f"<{len(value)} values>"],
                f"the list holds {len(value)} values, more than {MAX_IN_VALUES}; filter on a "
                "range, or split the query",
            )
        typed = {_typed(v, arrow_type, item, allow_null=True) for v in value}
        # a time between two of the column's ticks equals no value of the column
        ordered = tuple(
            sorted((v for v in typed if v is not None and type(v) is not Fraction), key=_order)
        )
        return Predicate(column, op, ordered + ((None,) if None in typed else ()))
    typed = _typed(value, arrow_type, item, allow_null=False)
    if type(typed) is Fraction:
        return _between_ticks(column, op, typed)
    return Predicate(column, op, typed)


def _between_ticks(column: str, op: str, value: Fraction) -> Predicate:
    """The predicate ``column op value`` for a time ``value`` (in the column's unit)
    that falls between two of the column's ticks, as one on the tick below it: no
    value equals it, each is either below or above it, as pyarrow compares them."""
    below = math.floor(value)
    if op == "=":
        return Predicate(column, "in", ())  # no row
    if op == "!=":
        return Predicate(column, "not in", (None,))  # every row but the nulls
    return Predicate(column, "<=" if op in ("<", "<=") else ">", below)


def _order(value: Any) -> Any:
    return (value,) if not isinstance(value, bool) else (int(value),)


def _typed(value: Any, arrow_type: pa.DataType, item: Sequence[Any], allow_null: bool) -> Any:
    """``value`` as the canonical value for ``arrow_type``."""
    base = arrow_type.value_type if pat.is_dictionary(arrow_type) else arrow_type
    raw = list(item)
    if value is None:
        if allow_null:
            return None
        raise _refuse(
            raw, "a null satisfies no comparison; to match nulls use ['COLUMN', 'in', [null]]"
        )
    if pat.is_boolean(base):
        if isinstance(value, bool):
            return value
        raise _refuse(raw, f"{value!r} is not a boolean (column type {arrow_type})")
    if pat.is_integer(base):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _refuse(raw, f"{value!r} is not a number (column type {arrow_type})")
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _refuse(raw, f"{value!r} is not a finite number; use a finite one")
            if not value.is_integer():
                return value
            value = int(value)
        info = _int_range(base)
        if not info[0] <= value <= info[1]:
            raise _refuse(raw, f"{value} is outside the range of the column's type {arrow_type}")
        return value
    if pat.is_floating(base):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _refuse(raw, f"{value!r} is not a number (column type {arrow_type})")
        if not math.isfinite(value):
            raise _refuse(raw, f"{value!r} is not a finite number; use a finite one")
        return float(value)
    if pat.is_string(base) or pat.is_large_string(base):
        if isinstance(value, str):
            return value
        raise _refuse(raw, f"{value!r} is not a string (column type {arrow_type})")
    if pat.is_timestamp(base):
        return _timestamp(value, base, raw)
    if pat.is_date32(base):
        return _date(value, raw)
    raise _refuse(raw, f"column type {arrow_type} cannot be filtered")  # pragma: no cover


def _int_range(arrow_type: pa.DataType) -> tuple[int, int]:
    bits = arrow_type.bit_width
    if pat.is_signed_integer(arrow_type):
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return 0, (1 << bits) - 1


def _timestamp(value: Any, arrow_type: pa.TimestampType, raw: list[Any]) -> int | Fraction:
    """An ISO 8601 text or a datetime as an int in the column's unit (naive values
    read as UTC), or an int as it is; a time between two ticks of the unit (a
    fraction of a second finer than it) as the exact :class:`Fraction` of ticks."""
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(1 << 63) <= value < (1 << 63):
            raise _refuse(raw, f"{value} is outside a 64-bit timestamp")
        return value
    fraction = None  # the text's fraction of a second, all its digits
    if isinstance(value, str):
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            value = _dt.datetime.fromisoformat(text)
        except ValueError:
            raise _refuse(
                raw,
                f"{value!r} is not an ISO 8601 timestamp (e.g. 2025-01-31T12:00:00Z) nor an "
                f"integer in the column's unit ({arrow_type.unit})",
            ) from None
        found = _SECOND_FRACTION.search(text)
        digits = found.group(1) if found else ""
        if digits and int(digits[:6].ljust(6, "0")) == value.microsecond:
            fraction = Fraction(int(digits), 10 ** len(digits))
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        delta = value - _EPOCH
        seconds = Fraction(delta.days * 86_400 + delta.seconds)
        if fraction is None:
            fraction = Fraction(delta.microseconds, 1_000_000)
        else:  # the text's digits, not the 6 the datetime kept of them
            seconds += Fraction(delta.microseconds - value.microsecond, 1_000_000)
        ticks = (seconds + fraction) * _UNIT_PER_SECOND[arrow_type.unit]
        return int(ticks) if ticks.denominator == 1 else ticks
    raise _refuse(raw, f"{value!r} is not a timestamp (ISO 8601 text or an integer)")


def _date(value: Any, raw: list[Any]) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(1 << 31) <= value < (1 << 31):
            raise _refuse(raw, f"{value} is outside a date32")
        return value
    if isinstance(value, str):
        try:
            value = _dt.date.fromisoformat(value.strip())
        except ValueError:
            raise _refuse(raw, f"{value!r} is not an ISO date (e.g. 2025-01-31)") from None
    if isinstance(value, _dt.datetime):
        value = value.date()
    if isinstance(value, _dt.date):
        return (value - _DATE_EPOCH).days
    raise _refuse(raw, f"{value!r} is not a date (ISO text or days since 1970-01-01)")


_ARG_OPS = ("<=", ">=", "!=", "==", "=", "<", ">")


def parse_filter_arg(text: str, schema: pa.Schema) -> list[Any]:
    """One ``--filter EXPR`` as a ``[column, op, value]`` predicate, the value read as
    the column's type: ``col=value``, ``col!=value``, ``col<value``, ``col<=value``,
    ``col>value``, ``col>=value``, ``col in a,b,c`` (``col not in a,b,c``).

    Several ``--filter`` options are the AND of their predicates. An empty value
    item in a list, or ``null``, is a null. :class:`ConfigError` names the expression.
    """
    stripped = text.strip()
    column: str
    for op_word in ("not in", "in"):
        head, sep, rest = stripped.partition(f" {op_word} ")
        if sep and head.strip() and " " not in head.strip():
            column = head.strip()
            items = _split_items(rest)
            arrow_type = _arg_column_type(text, column, schema)
            values = [_arg_value(text, part, arrow_type, allow_null=True) for part in items]
            predicate = [column, op_word, values]
            _predicate(predicate, schema)
            return predicate
    for op in _ARG_OPS:
        head, sep, rest = stripped.partition(op)
        if sep and head.strip():
            column = head.strip()
            arrow_type = _arg_column_type(text, column, schema)
            value = _arg_value(text, rest.strip(), arrow_type, allow_null=False)
            predicate = [column, "=" if op == "==" else op, value]
            _predicate(predicate, schema)
            return predicate
    raise ConfigError(
        f"--filter {text!r}: not an expression; write col=value, col!=value, col<value, "
        "col<=value, col>value, col>=value or 'col in a,b,c'"
    )


def _split_items(text: str) -> list[str]:
    """The comma-separated items of an ``in`` list, blanks around each dropped; an item
    that starts with a quote and whose same quote is followed by a comma or the end
    keeps its commas (its quotes stay on, for :func:`_arg_value` to remove)."""
    items: list[str] = []
    start = 0
    while True:
        head = len(text) - len(text[start:].lstrip())
        if text[head : head + 1] in ("'", '"'):
            close = text.find(text[head], head + 1)
            while close != -1:
                after = len(text) - len(text[close + 1 :].lstrip())
                if after == len(text) or text[after] == ",":
                    items.append(text[head : close + 1])
                    if after == len(text):
                        return items
                    start = after + 1
                    break
                close = text.find(text[head], close + 1)
            if close != -1:
                continue
        comma = text.find(",", start)
        if comma == -1:
            items.append(text[start:].strip())
            return items
        items.append(text[start:comma].strip())
        start = comma + 1


def _arg_column_type(text: str, column: str, schema: pa.Schema) -> pa.DataType:
    index = schema.get_field_index(column)
    if index < 0:
        names = ", ".join(schema.names[:20])
        raise ConfigError(
            f"--filter {text!r}: the table has no column {column!r} (its columns: {names})"
        )
    return schema.field(index).type


def _arg_value(text: str, word: str, arrow_type: pa.DataType, allow_null: bool) -> Any:
    """``word`` read as a value of ``arrow_type`` (strings as written, quotes removed)."""
    base = arrow_type.value_type if pat.is_dictionary(arrow_type) else arrow_type
    if allow_null and word in ("", "null"):
        return None
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        word = word[1:-1]
    elif pat.is_boolean(base):
        lowered = word.lower()
        if lowered in ("true", "false"):
            return lowered == "true"
        raise ConfigError(f"--filter {text!r}: {word!r} is not true or false")
    elif pat.is_integer(base) or pat.is_timestamp(base) or pat.is_date32(base):
        if _is_int_text(word):
            return int(word)
        if pat.is_integer(base):
            return _float_word(text, word)
    elif pat.is_floating(base):
        return _float_word(text, word)
    return word


def _is_int_text(word: str) -> bool:
    body = word[1:] if word[:1] in "+-" else word
    return body.isascii() and body.isdigit()


def _float_word(text: str, word: str) -> float:
    try:
        return float(word)
    except ValueError:
        raise ConfigError(f"--filter {text!r}: {word!r} is not a number") from None


def _canonical_of(arrow_type: pa.DataType) -> Callable[[Any], Any]:
    """:func:`_canonical_value` for one column type, with the checks that type needs
    made once: a value that is already canonical (an int in range, a finite float,
    a str) comes back as it is, any other through :func:`_canonical_value`."""
    base = arrow_type.value_type if pat.is_dictionary(arrow_type) else arrow_type

    def slow(value: Any) -> Any:
        return _canonical_value(value, arrow_type)

    if pat.is_integer(base):
        low, high = _int_range(base)
        return lambda v: v if type(v) is int and low <= v <= high else slow(v)
    if pat.is_floating(base):
        return lambda v: v if type(v) is float and math.isfinite(v) else slow(v)
    if pat.is_string(base) or pat.is_large_string(base):
        return lambda v: v if type(v) is str else slow(v)
    return slow


def _canonical_value(value: Any, arrow_type: pa.DataType) -> Any:
    """A value found in a table's metadata or a footer (a partition value, a bound)
    as the canonical value of ``arrow_type``; None when it cannot be one."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        typed = _typed(value, arrow_type, ["", "=", value], allow_null=True)
    except ConfigError:
        return None
    return math.floor(typed) if type(typed) is Fraction else typed

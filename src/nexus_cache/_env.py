"""The one reader of environment variables, and the one form of their errors.

Each package declares the variables it reads once, as a table of
:class:`Variable` (name, kind, default, one-line doc); this module is the only
one that reads ``os.environ``, and ``docs/configuration.md`` is checked
against the tables. One rule for every variable: an empty or blank value
counts as unset. A value that cannot be used raises
:class:`~nexus_cache.errors.ConfigError` naming the variable, the value and
what is accepted (``NAME='value' is not accepted; use ...``); byte sizes go
through :mod:`nexus_cache._sizes` and numbers through
:mod:`nexus_cache._numbers`, as everywhere else.

The ``parse_*`` functions are the same checks for values that come from
elsewhere (constructor arguments, TOML keys), so a setting is refused in one
form whichever way it was given. Pure functions of their arguments and
``os.environ``: thread-safe.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from nexus_cache._numbers import parse_float_text, parse_int_text
from nexus_cache._sizes import parse_size
from nexus_cache.errors import ConfigError

__all__ = [
    "FALSE_WORDS",
    "TRUE_WORDS",
    "Kind",
    "Variable",
    "environ_of",
    "parse_choice",
    "parse_flag",
    "parse_number",
    "parse_whole",
    "raw",
    "read",
    "read_fields",
    "refusal",
]

Kind = Literal["size", "int", "float", "bool", "enum", "path", "str"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable a package reads.

    ``default`` is the value that unset means, written as the variable would
    be set (``"4"``, ``"2GiB"``, ``"auto"``); ``None`` when unset means
    something that is no value (``unset``: what, in words, for the docs).
    ``choices`` (enum), ``minimum``/``maximum`` (int, float; ``strict``: the
    minimum itself is refused; a size's ``minimum=0`` accepts ``0``) and
    ``unit`` (float: ``"seconds"``) say what is accepted. ``field``: the
    field of the package's configuration class the variable sets, where a
    configuration class reads it.
    """

    name: str
    kind: Kind
    doc: str
    default: str | None = None
    unset: str = ""
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    strict: bool = False
    unit: str = ""
    field: str | None = None

    def __post_init__(self) -> None:
        if self.default is None and not self.unset:
            raise ValueError(f"{self.name}: say what unset means (unset=...) or give a default")
        if self.default is not None:
            parse(self, self.default)  # a declared default the reader refuses is a typo

    @property
    def shown_default(self) -> str:
        """The default as ``docs/configuration.md`` starts its cell: ```4``` or the words."""
        return f"`{self.default}`" if self.default is not None else self.unset


def environ_of(environ: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """``environ``, else the process environment (``os.environ``)."""
    return os.environ if environ is None else environ


def raw(variable: Variable, environ: Mapping[str, str] | None = None) -> str | None:
    """The variable's text as set, or ``None`` when unset, empty or blank."""
    value = environ_of(environ).get(variable.name)
    return value if value is not None and value.strip() != "" else None


def read(variable: Variable, environ: Mapping[str, str] | None = None) -> Any:
    """The variable's value, parsed by its kind: the text set, else its default,
    else ``None``. Raises :class:`ConfigError` naming the variable."""
    text = raw(variable, environ)
    if text is None:
        text = variable.default
    return None if text is None else parse(variable, text)


def read_fields(
    table: Iterable[Variable], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``{field: text}`` of the variables of ``table`` that set a field and are set:
    the texts a configuration class validates (and names by the variable)."""
    env = environ_of(environ)
    return {
        v.field: text for v in table if v.field is not None and (text := raw(v, env)) is not None
    }


def parse(variable: Variable, text: str) -> Any:
    """``text`` as a value of ``variable``'s kind; ConfigError names the variable."""
    name, kind = variable.name, variable.kind
    if kind == "size":
        return parse_size(text, name=name, allow_zero=variable.minimum == 0)
    if kind == "int":
        return parse_whole(text, name, minimum=variable.minimum, maximum=variable.maximum)
    if kind == "float":
        return parse_number(
            text,
            name,
            minimum=variable.minimum,
            maximum=variable.maximum,
            strict=variable.strict,
            unit=variable.unit,
        )
    if kind == "bool":
        return parse_flag(text, name)
    if kind == "enum":
        return parse_choice(text, name, variable.choices)
    if kind == "path":
        return Path(text.strip()).expanduser()
    return text.strip()


def refusal(name: str, value: Any, accepted: str) -> ConfigError:
    """The one form of a refused setting: ``name=value is not accepted; use accepted``."""
    return ConfigError(f"{name}={value!r} is not accepted; use {accepted}")


def _shown(number: float) -> str:
    return f"{number:.0f}" if float(number).is_integer() else f"{number:g}"


def _bounds(minimum: float | None, maximum: float | None, strict: bool) -> str:
    if minimum is not None and maximum is not None and not strict:
        return f" from {_shown(minimum)} to {_shown(maximum)}"
    parts = []
    if minimum is not None:
        parts.append(f"{'>' if strict else '>='} {_shown(minimum)}")
    if maximum is not None:
        parts.append(f"<= {_shown(maximum)}")
    return (" " + " and ".join(parts)) if parts else ""


def parse_whole(
    value: Any, name: str, *, minimum: float | None = None, maximum: float | None = None
) -> int:
    """An ``int`` or its ASCII text within the bounds; ``bool`` and floats are refused."""
    error = refusal(name, value, f"a whole number{_bounds(minimum, maximum, False)}")
    if isinstance(value, bool):
        raise error
    if isinstance(value, str):
        try:
            number = parse_int_text(value)
        except ValueError:
            raise error from None
    elif isinstance(value, int):
        number = value
    else:
        raise error
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        raise error
    return number


def parse_number(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
    unit: str = "",
) -> float:
    """A finite number (a real or its ASCII text) within the bounds; ``bool``, NaN and
    infinities are refused. ``unit`` names what it counts in the message."""
    what = f"a finite number{f' of {unit}' if unit else ''}"
    error = refusal(name, value, f"{what}{_bounds(minimum, maximum, strict)}")
    if isinstance(value, bool):
        raise error
    try:
        number = parse_float_text(value) if isinstance(value, str) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise error from None
    if not math.isfinite(number):
        raise error
    if minimum is not None and (number <= minimum if strict else number < minimum):
        raise error
    if maximum is not None and number > maximum:
        raise error
    return number


def parse_flag(value: Any, name: str) -> bool:
    """``True``/``False``, or one of :data:`TRUE_WORDS` / :data:`FALSE_WORDS` (any case)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise refusal(name, value, f"{'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}")


def parse_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """``value`` (case and surrounding spaces ignored) if it is one of ``choices``."""
    text = str(value).strip().lower()
    if text not in choices:
        raise refusal(name, value, f"one of: {', '.join(choices)}")
    return text

"""Find the directives by which NVRTC may read a file the key cannot see.

A regex over raw lines cannot decide this: before directives are recognised,
the compiler applies translation phases 1 to 3, so ``%:include "x.h"``
(digraph), ``??=include`` (trigraph, before C++17), ``#inc\\<newline>lude``
(line splice), ``#/* c */include``, ``/* */ #include`` and form feeds or
vertical tabs around the ``#`` all open ``x.h``. This module applies those
phases and then lexes the text (comments, string and character literals,
raw strings, pp-numbers) to find every ``#include`` / ``#include_next`` /
``#import`` / ``#embed`` whose operand is not ``<...>``, and every
``__has_include`` / ``__has_include_next`` / ``__has_embed`` whose argument
is not ``<...>``. An operand that names an absolute path (``</abs/x.h>``,
``"/abs/x.h"``) counts whatever its delimiters: NVRTC opens it as it is,
without searching, even with ``no_source_include``. With
``source_dir=False`` (``no_source_include=True``) a quoted relative name no
longer counts; a computed operand (``#include MACRO``) still does, since the
macro may spell an absolute path.

The answer must never be "no" when NVRTC would read the file. Where the
lexing depends on the language mode (trigraphs exist before C++17, digit
separators from C++14, raw strings from C++11) or on a detail the standard
leaves open (a backslash followed by spaces before the newline), the text is
lexed once per reading and a directive found under *any* reading counts. A
``#`` also counts wherever it stands on the line (the standard wants it
first), so the scan can refuse a source NVRTC would accept, never the
reverse. Only what a comment or a literal hides, under every reading, is
left alone. Pure functions; thread-safe.
"""

from __future__ import annotations

import re

__all__ = ["find_file_directive"]

# Phase 1: the nine trigraphs (C++ before 17; NVRTC applies them for
# -std=c++03/11/14, as measured).
_TRIGRAPHS = {
    b"=": b"#",
    b"/": b"\\",
    b"'": b"^",
    b"(": b"[",
    b")": b"]",
    b"!": b"|",
    b"<": b"{",
    b">": b"}",
    b"-": b"~",
}
_TRIGRAPH = re.compile(rb"\?\?([=/'()!<>-])")
# Phase 2: a backslash right before a newline joins the lines. The loose
# reading also joins across trailing blanks and a lone CR (other compilers do).
_SPLICE = re.compile(rb"\\\r?\n")
_LOOSE_SPLICE = re.compile(rb"\\[ \t\f\v]*(?:\r\n|\r|\n)")
# Words without which no directive of interest can exist in a reading.
_WORDS = (b"include", b"import", b"embed")

_IDENT_CHAR = rb"[A-Za-z0-9_$\x80-\xff]"
_IDENT = rb"(?:[A-Za-z_$\x80-\xff]|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})" + (
    rb"(?:[A-Za-z0-9_$\x80-\xff]|\\u[0-9A-Fa-f]{4}|\\U[0-9A-Fa-f]{8})*"
)
_RAW = (
    rb"(?<!" + _IDENT_CHAR + rb")(?:u8|u|U|L)?R\"(?P<d>[^ ()\\\t\v\f\r\n]{0,16})\("
    rb"(?s:.*?)\)(?P=d)\""
)
_COMMON_HEAD = rb"(?P<c>//[^\r\n]*|/\*(?s:.*?)(?:\*/|\Z))"
_COMMON_TAIL = (
    rb"|(?P<i>" + _IDENT + rb")"
    rb"|\"(?:[^\"\\\r\n]|\\[^\r\n])*(?:\"|(?=[\r\n])|\Z)"
    rb"|'(?:[^'\\\r\n]|\\[^\r\n])*(?:'|(?=[\r\n])|\Z)"
    rb"|(?P<h>#|%:)"
    rb"|[^/\"'#%A-Za-z_$\x80-\xff0-9.\\]+"
    rb"|(?s:.)"
)


def _lexer(raw: bool, separators: bool) -> re.Pattern[bytes]:
    number = (
        rb"\.?[0-9](?:[eEpP][+-]|"
        + (rb"'[0-9A-Za-z_]|" if separators else b"")
        + (rb"[0-9A-Za-z_.$\x80-\xff])*")
    )
    parts = [_COMMON_HEAD]
    if raw:
        parts.append(b"|" + _RAW)
    parts.append(b"|" + number)
    return re.compile(b"".join(parts) + _COMMON_TAIL)


# One lexer per language reading: (raw strings, digit separators).
_LEXERS = {
    (True, True): _lexer(True, True),  # C++14 and later
    (True, False): _lexer(True, False),  # C++11
    (False, False): _lexer(False, False),  # C++03
}
_GAP = re.compile(rb"(?:[ \t\f\v\r]|/\*(?s:.*?)\*/)*")
_DIRECTIVE_NAME = re.compile(rb"(?:[ \t\f\v\r]|/\*(?s:.*?)\*/)*(" + _IDENT + rb")")
_NAME_START = re.compile(rb"[ \t\f\v]*([^ \t\f\v])")
_FILE_DIRECTIVES = frozenset({b"include", b"include_next", b"import", b"embed"})
_FILE_OPERATORS = frozenset({b"__has_include", b"__has_include_next", b"__has_embed"})


def _gap_end(text: bytes, pos: int) -> int:
    """Where the blanks and comments starting at ``pos`` end (``pos`` when there are none)."""
    gap = _GAP.match(text, pos)
    return gap.end() if gap is not None else pos  # the pattern matches the empty string


def _operand_reads(text: bytes, pos: int, source_dir: bool) -> bool:
    """Whether the operand at ``pos`` may name a file outside NVRTC's search list.

    ``<name>`` is looked up only in the search list and ``"name"`` first in the
    program's directory (when ``source_dir``); a name whose first non-blank is
    ``/`` is opened as it is (NVRTC keeps the blanks, so ``< /x.h>`` names no
    file; refusing it costs nothing). Anything else is computed: it counts.
    """
    end = _gap_end(text, pos)
    opener = text[end : end + 1]
    if opener not in (b"<", b'"'):
        return True
    first = _NAME_START.match(text, end + 1)
    if first is not None and first.group(1) == b"/":
        return True
    return opener == b'"' and source_dir


def _scan(text: bytes, lexer: re.Pattern[bytes], source_dir: bool) -> bytes | None:
    for m in lexer.finditer(text):
        if m.lastgroup == "h":
            name = _DIRECTIVE_NAME.match(text, m.end())
            if (
                name is not None
                and name.group(1) in _FILE_DIRECTIVES
                and _operand_reads(text, name.end(), source_dir)
            ):
                return _line_of(text, m.start())
        elif m.lastgroup == "i" and m.group("i") in _FILE_OPERATORS:
            paren = _gap_end(text, m.end())
            if text[paren : paren + 1] == b"(" and _operand_reads(text, paren + 1, source_dir):
                return _line_of(text, m.start())
    return None


def _line_of(text: bytes, pos: int) -> bytes:
    start = max(text.rfind(b"\n", 0, pos), text.rfind(b"\r", 0, pos)) + 1
    end = len(text)
    for sep in (b"\n", b"\r"):
        found = text.find(sep, pos)
        if found != -1:
            end = min(end, found)
    return text[start:end].strip()


def _readings(code: bytes) -> list[bytes]:
    """Every distinct text phases 1 and 2 can make of ``code``."""
    phase1 = [code]
    if b"??" in code:
        phase1.append(_TRIGRAPH.sub(lambda m: _TRIGRAPHS[m.group(1)], code))
    texts: list[bytes] = []
    for text in phase1:
        for splice in (_SPLICE, _LOOSE_SPLICE):
            joined = splice.sub(b"", text) if b"\\" in text else text
            if joined not in texts:
                texts.append(joined)
    return texts


def find_file_directive(code: bytes, *, source_dir: bool = True) -> bytes | None:
    """The first directive (its line) by which NVRTC may read a file outside its
    search list (relative to the program when ``source_dir``, or by an absolute
    path), under any reading of ``code``; ``None`` when there is none."""
    texts = _readings(code)
    if not any(word in text for text in texts for word in _WORDS):
        return None  # no reading can spell a file directive
    for text in texts:
        lexers = [_LEXERS[(True, True)]]
        if b"'" in text:
            lexers.append(_LEXERS[(True, False)])
        if b'R"' in text:
            lexers.append(_LEXERS[(False, False)])
        for lexer in lexers:
            found = _scan(text, lexer, source_dir)
            if found is not None:
                return found
    return None

"""Fuzz: no directive spelling that makes real NVRTC read ``./x.h`` may get a key.

Each case is compiled by real NVRTC (cubin for an explicit arch: no GPU
needed) twice, in a working directory that holds ``x.h`` and then does not.
When the two outcomes differ, NVRTC read the file, so the key cannot prove
the binary and ``make_program_cache_key`` must refuse. Cases NVRTC does not
read are allowed either way (the scan may refuse more than needed).

``NEXUS_FUZZ_CASES`` raises the number of generated cases (default 24).
"""

from __future__ import annotations

import os
import random
import warnings
from pathlib import Path

import pytest

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program import make_program_cache_key

core = pytest.importorskip("cuda.core")

KERNEL = (
    '\n#ifndef VAL\n#define VAL 7\n#endif\nextern "C" __global__ void k(int *p) { *p = VAL; }\n'
)

# The spellings reported to open x.h while a raw-line regex derived a key.
REPORTED = [
    '%:include "x.h"',
    '#inc\\\nlude "x.h"',
    '#/* c */include "x.h"',
    '/* */ #include "x.h"',
    '\f#include "x.h"',
    '#\vinclude "x.h"',
]
# Lexical traps: a scanner that misreads a literal or a comment hides the include.
TRAPS = [
    "__device__ int q = 1'000 + 'a';\n/* x */ #include \"x.h\"\n",
    '__device__ const char *r = 0;/* \'" */\n#include "x.h"\n',
    '// comment \\\n#include "x.h"\n',  # spliced into the comment: not read
    '/*\n#include "x.h"\n*/\n',  # commented out: not read
    '#if __has_include("x.h")\n#define VAL 1\n#endif\n',
    "#include <x.h>\n",  # angle: NVRTC does not search the working directory
]

_HASH = ["#", "%:", "??="]
_LEAD = ["", " ", "\t", "\f", "\v", "/* */", "/*c*/ "]
_GAP = ["", " ", "\t", "\f", "\v", "/**/", "/* c */", "\\\n"]
_OPERAND = ['"x.h"', '"x.h"', '"x.h"', "<x.h>"]
_STD = [None, "c++11", "c++14", "c++17"]


def _spell(rng: random.Random) -> str:
    name = "include"
    if rng.random() < 0.4:
        cut = rng.randrange(1, len(name))
        name = name[:cut] + rng.choice(["\\\n", "??/\n"]) + name[cut:]
    return (
        rng.choice(_LEAD)
        + rng.choice(_HASH)
        + rng.choice(_GAP)
        + name
        + rng.choice([" ", "\t", "\v", "/**/", "\\\n "])
        + rng.choice(_OPERAND)
    )


def _cases() -> list[tuple[str, str | None]]:
    rng = random.Random(20261203)
    count = int(os.environ.get("NEXUS_FUZZ_CASES", "24"))
    out: list[tuple[str, str | None]] = [(d, None) for d in REPORTED + TRAPS]
    out += [('??=include "x.h"', "c++14"), ('#inc??/\nlude "x.h"', "c++11")]
    out += [(_spell(rng), rng.choice(_STD)) for _ in range(count)]
    return out


def _outcome(src: str, std: str | None) -> object:
    options = core.ProgramOptions(arch="sm_90", std=std)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return bytes(core.Program(src, "c++", options).compile("cubin").code)
    except Exception as exc:  # a failed compile is an outcome too
        return type(exc).__name__


def test_every_spelling_nvrtc_reads_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    header = tmp_path / "x.h"
    read_by_nvrtc = 0
    stale: list[tuple[str, str | None]] = []
    for directive, std in _cases():
        src = directive + KERNEL
        header.write_text("#define VAL 42\n")
        with_file = _outcome(src, std)
        header.unlink()
        without = _outcome(src, std)
        if with_file == without:
            continue  # NVRTC did not read x.h: refusing is allowed, not required
        read_by_nvrtc += 1
        options = core.ProgramOptions(arch="sm_90", std=std)
        try:
            make_program_cache_key(code=src, code_type="c++", options=options, target_type="cubin")
        except ProgramCacheKeyError:
            continue
        stale.append((directive, std))
    assert not stale, f"keys derived for sources whose output depends on ./x.h: {stale!r}"
    # The fuzz has teeth: every reported spelling (and more) really reads x.h.
    assert read_by_nvrtc >= len(REPORTED) + 3


def test_sources_nvrtc_does_not_read_keep_their_keys() -> None:
    options = core.ProgramOptions(arch="sm_90")
    for src in (
        '/*\n#include "x.h"\n*/\n',
        '// #include "x.h"\n',
        'const char *s = "#include \\"x.h\\"";\n',
        "#include <cuda/std/cstdint>\n",
        "#if __has_include(<x.h>)\n#endif\n",
    ):
        key = make_program_cache_key(
            code=src + KERNEL, code_type="c++", options=options, target_type="cubin"
        )
        assert len(key) == 32


@pytest.mark.parametrize("no_source_include", [None, True])
@pytest.mark.parametrize(
    "directive",
    [
        "#include <{h}>",
        "%:include <{h}>",
        "#include <//{h}>",
        '#include "{h}"',
        "#if __has_include(<{h}>)\n#define VAL 3\n#endif",
        "#define HDR <{h}>\n#include HDR",
    ],
)
def test_an_absolute_header_path_is_never_served_from_another_headers_entry(
    tmp_path: Path, directive: str, no_source_include: bool | None
) -> None:
    """NVRTC opens an absolute path as it is, whatever the delimiters and even
    with no_source_include: two headers' contents must not share an entry."""
    from nexus_cache.program import CompileInputs, FileStreamProgramCache, cached_compile

    header = tmp_path / "abs.h"
    src = directive.format(h=header) + "\n" + KERNEL
    options = core.ProgramOptions(arch="sm_90", no_source_include=no_source_include)
    header.write_text("#define VAL 1\n")
    first = _outcome(src, None)
    header.write_text("#define VAL 2\n")
    second = _outcome(src, None)
    if "__has_include" not in directive:
        assert first != second  # NVRTC really reads the header's contents
    else:
        header.unlink()
        assert _outcome(src, None) != second  # its presence changes the binary
        header.write_text("#define VAL 2\n")
    with FileStreamProgramCache(tmp_path / "cache") as cache:
        header.write_text("#define VAL 1\n")
        with pytest.raises(ProgramCacheKeyError, match="absolute path"):
            cached_compile(CompileInputs(src, "c++", options), "cubin", cache=cache)
        # extra_digest over the header lifts the refusal, and keys it by content.
        digest = header.read_bytes()
        got = cached_compile(
            CompileInputs(src, "c++", options), "cubin", cache=cache, extra_digest=digest
        )
        assert bytes(got.code) == first
        header.write_text("#define VAL 2\n")
        got = cached_compile(
            CompileInputs(src, "c++", options),
            "cubin",
            cache=cache,
            extra_digest=header.read_bytes(),
        )
        assert bytes(got.code) == second


def test_no_source_include_still_keys_searched_and_quoted_relative_names() -> None:
    options = core.ProgramOptions(arch="sm_90", no_source_include=True)
    for src in ('#include "x.h"\n', "#include <x.h>\n"):
        key = make_program_cache_key(
            code=src + KERNEL, code_type="c++", options=options, target_type="cubin"
        )
        assert len(key) == 32

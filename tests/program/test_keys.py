"""make_program_cache_key: determinism, canonical options, refusals, validation."""

from __future__ import annotations

import pytest

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program.keys import (
    KEY_SCHEMA_VERSION,
    SUPPORTED_TARGETS,
    _derive,
    make_program_cache_key,
)

core = pytest.importorskip("cuda.core")
ProgramOptions = core.ProgramOptions

SRC = 'extern "C" __global__ void k(int *a) { *a = 1; }'
PTX = ".version 8.0\n.target sm_90\n.address_size 64\n"
NVVM_IR = 'target triple = "nvptx64-nvidia-cuda"\n'


def key(code: str = SRC, code_type: str = "c++", target: str = "cubin", **kw: object) -> bytes:
    names = kw.pop("name_expressions", ())
    extra = kw.pop("extra_digest", None)
    opts = kw.pop("options", None)
    if opts is None:
        kw.setdefault("arch", "sm_90")
        opts = ProgramOptions(**kw)
    return make_program_cache_key(
        code=code,
        code_type=code_type,
        options=opts,
        target_type=target,
        name_expressions=names,  # type: ignore[arg-type]
        extra_digest=extra,  # type: ignore[arg-type]
    )


# -- determinism and sensitivity ---------------------------------------------------


def test_key_is_deterministic_sha256_digest() -> None:
    a, b = key(), key()
    assert a == b
    assert isinstance(a, bytes)
    assert len(a) == 32


@pytest.mark.parametrize(
    ("kw", "other"),
    [
        ({}, {"code": SRC + " "}),
        ({}, {"target": "ptx"}),
        ({}, {"arch": "sm_80"}),
        ({}, {"name": "other_program"}),
        ({}, {"extra_digest": b"\x01"}),
        ({"extra_digest": b"\x01"}, {"extra_digest": b"\x02"}),
        ({}, {"debug": True}),
        ({}, {"ftz": False}),
        ({}, {"define_macro": "A"}),
        ({}, {"code_type": "ptx", "code": SRC}),
    ],
)
def test_key_changes_with_every_input(kw: dict, other: dict) -> None:
    assert key(**kw) != key(**other)


def test_schema_version_is_part_of_the_key(monkeypatch: pytest.MonkeyPatch) -> None:
    before = key()
    monkeypatch.setattr(_derive, "KEY_SCHEMA_VERSION", KEY_SCHEMA_VERSION + 1)
    assert key() != before


def test_supported_targets_mirror_program_compile() -> None:
    assert {
        "c++": frozenset({"ptx", "cubin", "ltoir"}),
        "ptx": frozenset({"ptx", "cubin"}),
        "nvvm": frozenset({"ptx", "ltoir"}),
    } == SUPPORTED_TARGETS


@pytest.mark.parametrize(
    ("code_type", "target"),
    [("ptx", "ltoir"), ("nvvm", "cubin"), ("fortran", "cubin"), ("c++", "fatbin")],
)
def test_unsupported_code_and_target_types_are_refused(code_type: str, target: str) -> None:
    with pytest.raises(ProgramCacheKeyError, match="not supported"):
        key(code_type=code_type, target=target)


def test_code_and_target_type_are_case_insensitive() -> None:
    assert key(code_type="C++", target="CUBIN") == key()


# -- canonical option fingerprints -------------------------------------------------

EQUAL_SPELLINGS = [
    ({"ptxas_options": "-v"}, {"ptxas_options": ["-v"]}, {"ptxas_options": ("-v",)}),
    ({"debug": False}, {"debug": None}, {}),
    ({"ftz": True}, {"ftz": 1}, {"ftz": "yes"}),
    ({"max_register_count": 32}, {"max_register_count": "32"}),
    (
        {"define_macro": "A=1"},
        {"define_macro": ("A", "1")},
        {"define_macro": ["A=1"]},
        {"define_macro": [("A", "1")]},
    ),
    ({"undefine_macro": "X"}, {"undefine_macro": ["X"]}, {"undefine_macro": ("X",)}),
    ({"diag_suppress": 5}, {"diag_suppress": [5]}, {"diag_suppress": ("5",)}),
    ({"ptxas_options": []}, {"ptxas_options": None}),
    ({"use_libdevice": True}, {}),  # NVVM-only field: NVRTC never sees it
]


@pytest.mark.parametrize("spellings", EQUAL_SPELLINGS)
def test_equivalent_spellings_hash_equal(spellings: tuple[dict, ...]) -> None:
    keys = {key(**s) for s in spellings}
    assert len(keys) == 1


DIFFERENT = [
    ({"ptxas_options": ["-v", "-O2"]}, {"ptxas_options": ["-O2", "-v"]}),  # order is semantic
    ({"ptxas_options": "-v -O2"}, {"ptxas_options": ["-v", "-O2"]}),  # one flag vs two
    ({"ftz": False}, {}),  # --ftz=false is emitted
    ({"define_macro": ("A", "B")}, {"define_macro": ["A", "B"]}),  # A=B vs A and B
    ({"relocatable_device_code": False}, {"relocatable_device_code": True}),
]


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_different_compiler_inputs_hash_differently(a: dict, b: dict) -> None:
    assert key(**a) != key(**b)


def test_include_path_list_and_tuple_hash_equal_with_extra_digest() -> None:
    d = b"headers-v1"
    assert key(include_path=["/a", "/b"], extra_digest=d) == key(
        include_path=("/a", "/b"), extra_digest=d
    )
    assert key(include_path="/a", extra_digest=d) == key(include_path=["/a"], extra_digest=d)
    assert key(include_path=["/a", "/b"], extra_digest=d) != key(
        include_path=["/b", "/a"], extra_digest=d
    )


def test_mapping_options_equal_program_options() -> None:
    opts = {"arch": "sm_90", "name": "default_program", "debug": True}
    assert key(options=opts) == key(debug=True)
    assert key(options={"arch": "sm_90"}) == key()  # name defaults like Program's


def test_unknown_fields_fail_closed() -> None:
    base = {"arch": "sm_90"}
    assert key(options={**base, "future_flag": True}) != key(options=base)
    with pytest.raises(ProgramCacheKeyError, match="future_flag"):
        key(options={**base, "future_flag": object()})


@pytest.mark.parametrize(
    "irrelevant",
    [
        {"include_path": ["/x"]},
        {"std": "c++20"},
        {"define_macro": "A"},
        {"frandom_seed": "1"},
        {"pch": True},
        {"numba_debug": True},
    ],
)
def test_fields_the_linker_never_sees_do_not_perturb_ptx_keys(irrelevant: dict) -> None:
    assert key(PTX, "ptx", **irrelevant) == key(PTX, "ptx")


def test_linker_time_counts_by_presence_only_and_is_not_refused() -> None:
    assert key(PTX, "ptx", time="a.csv") == key(PTX, "ptx", time="b.csv")
    assert key(PTX, "ptx", time="a.csv") != key(PTX, "ptx")


@pytest.mark.parametrize("irrelevant", [{"no_cache": True}, {"frandom_seed": "7"}, {"pch": True}])
def test_fields_nvvm_drops_do_not_perturb_nvvm_keys(irrelevant: dict) -> None:
    assert key(NVVM_IR, "nvvm", "ptx", **irrelevant) == key(NVVM_IR, "nvvm", "ptx")


def test_nvvm_arch_sm_and_compute_are_one_virtual_arch() -> None:
    assert key(NVVM_IR, "nvvm", "ptx", arch="sm_90") == key(
        NVVM_IR, "nvvm", "ptx", arch="compute_90"
    )
    assert key(SRC, "c++", "ptx", arch="sm_90") != key(SRC, "c++", "ptx", arch="compute_90")


def test_nvvm_accepts_bytes_code_and_extra_sources_in_order() -> None:
    assert key(NVVM_IR.encode(), "nvvm", "ptx") == key(NVVM_IR, "nvvm", "ptx")
    a = key(NVVM_IR, "nvvm", "ptx", extra_sources=[("m1", "x"), ("m2", b"y")])
    b = key(NVVM_IR, "nvvm", "ptx", extra_sources=(("m1", "x"), ("m2", b"y")))
    c = key(NVVM_IR, "nvvm", "ptx", extra_sources=[("m2", b"y"), ("m1", "x")])
    assert a == b != c
    assert key(NVVM_IR, "nvvm", "ptx", extra_sources=[]) == key(NVVM_IR, "nvvm", "ptx")


def test_code_of_the_wrong_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be str"):
        key(SRC.encode())


# -- name expressions --------------------------------------------------------------


def test_name_expressions_are_order_insensitive_and_type_tagged() -> None:
    assert key(name_expressions=["f<int>", "f<float>"]) == key(
        name_expressions=("f<float>", "f<int>")
    )
    assert key(name_expressions=["f<int>"]) != key(name_expressions=[b"f<int>"])
    assert key(name_expressions=["f<int>"]) != key()


@pytest.mark.parametrize("bad", [[bytearray(b"f")], [1], "f<int>"])
def test_bad_name_expressions_are_type_errors(bad: object) -> None:
    with pytest.raises(TypeError, match="name_expressions"):
        key(name_expressions=bad)


def test_name_expressions_do_not_perturb_backends_that_ignore_them() -> None:
    assert key(PTX, "ptx", name_expressions=["f"]) == key(PTX, "ptx")
    assert key(NVVM_IR, "nvvm", "ptx", name_expressions=["f"]) == key(NVVM_IR, "nvvm", "ptx")


# -- refusals ----------------------------------------------------------------------

EXTERNAL = [
    {"include_path": ["/usr/include/x"]},
    {"include_path": "/inc"},
    {"pre_include": "pre.h"},
    {"pch": True},
    {"use_pch": "k.pch"},
    {"pch_dir": "/tmp/pch"},
    {"name": "/src/kernel.cu"},
    {"name": "rel/kernel.cu"},
    {"name": "C:\\src\\kernel.cu"},
]


@pytest.mark.parametrize("opt", EXTERNAL)
def test_external_content_options_need_extra_digest(opt: dict) -> None:
    field = next(iter(opt))
    with pytest.raises(ProgramCacheKeyError, match="extra_digest") as info:
        key(**opt)
    assert field in str(info.value)
    assert len(key(**opt, extra_digest=b"digest-of-the-files")) == 32


def test_libdevice_needs_extra_digest_for_nvvm_only() -> None:
    with pytest.raises(ProgramCacheKeyError, match=r"use_libdevice.*extra_digest"):
        key(NVVM_IR, "nvvm", "ptx", use_libdevice=True)
    assert key(NVVM_IR, "nvvm", "ptx", use_libdevice=True, extra_digest=b"libdevice-sha")
    assert key(NVVM_IR, "nvvm", "ptx", use_libdevice=False) == key(NVVM_IR, "nvvm", "ptx")


def test_program_name_with_directory_is_accepted_with_no_source_include() -> None:
    assert len(key(name="/src/kernel.cu", no_source_include=True)) == 32
    # ...and the directory-less name is fine either way
    assert len(key(name="kernel.cu")) == 32


@pytest.mark.parametrize(
    "directive",
    [
        '#include "local.h"',
        '  #  include "sub/x.cuh"',
        "#include HEADER_MACRO",
        '#if __has_include("x.h")\n#endif',
    ],
)
def test_source_relative_includes_need_extra_digest(directive: str) -> None:
    code = directive + "\n" + SRC
    with pytest.raises(ProgramCacheKeyError, match="extra_digest"):
        key(code)
    assert len(key(code, extra_digest=b"h")) == 32
    if "MACRO" in directive:
        # A computed name may spell an absolute path, which NVRTC opens anyway.
        with pytest.raises(ProgramCacheKeyError, match="absolute path"):
            key(code, no_source_include=True)
    else:
        assert len(key(code, no_source_include=True)) == 32


def test_angle_includes_and_commented_includes_are_accepted() -> None:
    assert len(key("#include <cuda/std/cstdint>\n" + SRC)) == 32
    assert len(key('// #include "x.h"\n' + SRC)) == 32
    assert len(key(PTX + '#include "x.h"\n', "ptx")) == 32  # the linker has no preprocessor


SIDE_EFFECTS = [
    {"time": "timing.csv"},
    {"fdevice_time_trace": "trace.json"},
    {"create_pch": "k.pch"},
    {"ptxas_options": ["-v", "--compiler-stats-file=stats.json"]},
    {"ptxas_options": "-o out.cubin"},
]


@pytest.mark.parametrize("opt", SIDE_EFFECTS)
def test_side_effect_options_are_refused_even_with_extra_digest(opt: dict) -> None:
    field = next(iter(opt))
    for extra in (None, b"digest"):
        with pytest.raises(ProgramCacheKeyError, match=field) as info:
            key(**opt, extra_digest=extra)
        assert "extra_digest does not lift" in str(info.value)


def test_ptxas_output_file_is_refused_on_the_linker_path_too() -> None:
    with pytest.raises(ProgramCacheKeyError, match="ptxas_options"):
        key(PTX, "ptx", ptxas_options=["--output-file=x.cubin"])


@pytest.mark.parametrize("code_type", ["c++", "ptx"])
def test_extra_sources_outside_nvvm_is_refused(code_type: str) -> None:
    with pytest.raises(ProgramCacheKeyError, match="extra_sources"):
        key(SRC if code_type == "c++" else PTX, code_type, extra_sources=[("m", "x")])


def test_missing_arch_and_options_are_refused() -> None:
    with pytest.raises(ProgramCacheKeyError, match="arch"):
        key(options={"name": "x"})
    with pytest.raises(ProgramCacheKeyError, match="options is required"):
        make_program_cache_key(code=SRC, code_type="c++", options=None, target_type="cubin")


# -- extra_digest validation -------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [0, 1, False, b"", bytearray(), memoryview(b""), "", "abc", 1.5, []]
)
def test_extra_digest_must_be_non_empty_bytes_like(bad: object) -> None:
    with pytest.raises(ProgramCacheKeyError, match="extra_digest") as info:
        key(extra_digest=bad)
    assert isinstance(info.value, ValueError)


def test_extra_digest_bytes_like_forms_agree() -> None:
    d = b"\x00\x01digest"
    assert key(extra_digest=d) == key(extra_digest=bytearray(d)) == key(extra_digest=memoryview(d))


@pytest.mark.parametrize("field", ["ftz", "prec_div", "prec_sqrt", "fma"])
def test_driver_linker_collapses_the_fields_culink_ignores(monkeypatch, field):
    from nexus_cache.program.keys import _probes

    def ptx_keys() -> set[bytes]:
        return {key(PTX, "ptx", **{field: v}) for v in (None, True, False)}

    monkeypatch.setattr(_probes, "linker_identity", lambda: b"linker=nvjitlink:13.0;lib=x")
    assert len(ptx_keys()) == 3  # nvJitLink reads them: three different compiles
    monkeypatch.setattr(_probes, "linker_identity", lambda: b"linker=driver:13000;lib=y")
    assert len(ptx_keys()) == 1  # cuLink never sees them: one compile
    assert key(PTX, "ptx", max_register_count=32) != key(PTX, "ptx")  # others still count
    monkeypatch.setattr(_probes, "linker_identity", lambda: b"linker=probe-failed:OSError")
    assert len(ptx_keys()) == 3  # unknown linker: nothing collapses

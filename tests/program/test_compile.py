"""cached_compile: misses compile and store, hits rebuild ObjectCode without compiling."""

from __future__ import annotations

import io
import warnings
from typing import Any, ClassVar

import pytest

from nexus_cache.errors import ProgramCacheKeyError
from nexus_cache.program import (
    CacheableProgram,
    CompileInputs,
    InMemoryProgramCache,
    _ptxcheck,
    cached_compile,
    make_program_cache_key,
)
from nexus_cache.program._sidecar import SIDECAR_SUFFIX, sidecar_key

core = pytest.importorskip("cuda.core")
ProgramOptions = core.ProgramOptions

TEMPLATE = "template <typename T> __global__ void fn(T *a, T b) { a[threadIdx.x] += b; }\n"
PLAIN = 'extern "C" __global__ void k(int *a) { *a = 1; }\n'
NAMES = ("fn<float>", b"fn<double>")


def opts(**kw: Any) -> Any:
    kw.setdefault("arch", "sm_90")
    return ProgramOptions(**kw)


class CountingInputs(CompileInputs):
    """CompileInputs whose Program construction is counted (a miss builds one)."""

    built: ClassVar[list[int]] = []

    def new_program(self) -> Any:
        type(self).built.append(1)
        return super().new_program()


@pytest.fixture
def counting() -> type[CountingInputs]:
    CountingInputs.built = []
    return CountingInputs


def test_miss_compiles_and_stores_then_hit_skips_the_compiler(counting: type) -> None:
    cache = InMemoryProgramCache()
    inputs = counting(PLAIN, "c++", opts())
    first = cached_compile(inputs, "cubin", cache=cache)
    assert len(counting.built) == 1
    assert len(cache) == 1  # raw binary only: no sidecar without name expressions
    second = cached_compile(inputs, "cubin", cache=cache)
    assert len(counting.built) == 1
    assert bytes(second.code) == bytes(first.code)
    assert (
        (second.name, second.code_type)
        == (first.name, first.code_type)
        == (
            "default_program",
            "cubin",
        )
    )
    assert second is not first


def test_stored_entry_is_the_raw_binary(counting: type) -> None:
    cache = InMemoryProgramCache()
    o = opts()
    obj = cached_compile(counting(PLAIN, "c++", o), "cubin", cache=cache)
    k = make_program_cache_key(code=PLAIN, code_type="c++", options=o, target_type="cubin")
    assert cache.get(k) == bytes(obj.code)
    assert cache.get(k)[:4] == b"\x7fELF"


def test_cacheable_program_is_a_real_program_and_shares_keys(counting: type) -> None:
    cache = InMemoryProgramCache()
    program = CacheableProgram(PLAIN, "c++", opts())
    assert isinstance(program, core.Program)
    obj = cached_compile(program, "cubin", cache=cache)
    cached_compile(counting(PLAIN, "c++", opts()), "cubin", cache=cache)
    assert counting.built == []  # same inputs, same key: a hit
    assert obj.code_type == "cubin"


def test_name_expressions_mapping_survives_a_hit(counting: type) -> None:
    cache = InMemoryProgramCache()
    inputs = counting(TEMPLATE, "c++", opts())
    fresh = cached_compile(inputs, "cubin", cache=cache, name_expressions=NAMES)
    hit = cached_compile(inputs, "cubin", cache=cache, name_expressions=list(reversed(NAMES)))
    assert len(counting.built) == 1
    assert hit.symbol_mapping == fresh.symbol_mapping
    assert set(hit.symbol_mapping) == {"fn<float>", b"fn<double>"}
    assert all(isinstance(v, bytes) for v in hit.symbol_mapping.values())


def test_binary_stays_raw_and_mapping_lives_in_the_sidecar() -> None:
    cache = InMemoryProgramCache()
    o = opts()
    fresh = cached_compile(
        CompileInputs(TEMPLATE, "c++", o), "cubin", cache=cache, name_expressions=NAMES
    )
    k = make_program_cache_key(
        code=TEMPLATE, code_type="c++", options=o, target_type="cubin", name_expressions=NAMES
    )
    assert cache.get(k) == bytes(fresh.code)
    meta = cache.get(k + SIDECAR_SUFFIX)
    assert meta is not None
    assert meta.startswith(b"{")
    assert b"_Z2fnIfEvPT_S0_" in meta


# json gives up on deep nesting with RecursionError, not ValueError
_DEEP = b'{"format":"nexus-cache/program-meta","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize("damage", ["delete", "garbage", "other-binary", "deeply-nested"])
def test_hit_without_a_valid_sidecar_is_a_miss(counting: type, damage: str) -> None:
    cache = InMemoryProgramCache()
    o = opts()
    inputs = counting(TEMPLATE, "c++", o)
    cached_compile(inputs, "cubin", cache=cache, name_expressions=NAMES)
    k = make_program_cache_key(
        code=TEMPLATE, code_type="c++", options=o, target_type="cubin", name_expressions=NAMES
    )
    if damage == "delete":
        del cache[sidecar_key(k)]
    elif damage == "garbage":
        cache[sidecar_key(k)] = b"\x80not json"
    elif damage == "deeply-nested":
        cache[sidecar_key(k)] = _DEEP
    else:
        cache[k] = cache.get(k) + b"\0"  # the sidecar now describes other bytes
    again = cached_compile(inputs, "cubin", cache=cache, name_expressions=NAMES)
    assert len(counting.built) == 2  # recompiled...
    assert set(again.symbol_mapping) == set(NAMES)
    cached_compile(inputs, "cubin", cache=cache, name_expressions=NAMES)
    assert len(counting.built) == 2  # ...and both halves were rewritten


def test_logs_are_written_on_a_miss_and_not_on_a_hit(counting: type) -> None:
    cache = InMemoryProgramCache()
    inputs = counting("#warning nexus-log-probe\n" + PLAIN, "c++", opts())
    miss_log, hit_log = io.StringIO(), io.StringIO()
    cached_compile(inputs, "cubin", cache=cache, logs=miss_log)
    cached_compile(inputs, "cubin", cache=cache, logs=hit_log)
    assert "nexus-log-probe" in miss_log.getvalue()
    assert hit_log.getvalue() == ""


def test_plain_program_is_keyed_through_cuda_core() -> None:
    cache = InMemoryProgramCache()
    fresh = cached_compile(
        core.Program(TEMPLATE, "c++", opts(name="tmpl")),
        "cubin",
        cache=cache,
        name_expressions=NAMES,
    )
    assert len(cache) == 2  # binary + sidecar (the name is not visible otherwise)

    class NoCompile:
        backend = "NVRTC"

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def compile(self, *args: Any, **kwargs: Any) -> Any:
            if "cache" not in kwargs:
                raise AssertionError("the compiler ran on a hit")
            return self.inner.compile(*args, **kwargs)

    hit = cached_compile(
        NoCompile(core.Program(TEMPLATE, "c++", opts(name="tmpl"))),
        "cubin",
        cache=cache,
        name_expressions=NAMES,
    )
    assert bytes(hit.code) == bytes(fresh.code)
    assert hit.name == "tmpl"
    assert hit.symbol_mapping == fresh.symbol_mapping


def test_plain_program_with_unkeyable_options_points_to_the_alternatives() -> None:
    program = core.Program(PLAIN, "c++", opts(include_path=["/x"]))
    with pytest.raises(ProgramCacheKeyError, match="CacheableProgram"):
        cached_compile(program, "cubin", cache=InMemoryProgramCache())


def test_include_path_compiles_with_extra_digest(tmp_path: Any, counting: type) -> None:
    (tmp_path / "val.h").write_text("#define VAL 7\n")
    src = '#include <val.h>\nextern "C" __global__ void k(int *a) { *a = VAL; }\n'
    inputs = counting(src, "c++", opts(include_path=[str(tmp_path)]))
    cache = InMemoryProgramCache()
    with pytest.raises(ProgramCacheKeyError, match="extra_digest"):
        cached_compile(inputs, "cubin", cache=cache)
    digest = b"sha256-of-val.h"
    cached_compile(inputs, "cubin", cache=cache, extra_digest=digest)
    cached_compile(inputs, "cubin", cache=cache, extra_digest=digest)
    cached_compile(inputs, "cubin", cache=cache, extra_digest=b"other")
    assert len(counting.built) == 2


def test_bad_arguments_are_refused() -> None:
    cache = InMemoryProgramCache()
    with pytest.raises(TypeError, match="CompileInputs"):
        cached_compile("source text", "cubin", cache=cache)
    with pytest.raises(TypeError, match="name_expressions"):
        cached_compile(
            CompileInputs(TEMPLATE, "c++", opts()),
            "cubin",
            cache=cache,
            name_expressions="fn<float>",
        )
    with pytest.raises(ProgramCacheKeyError, match="extra_digest"):
        cached_compile(CompileInputs(PLAIN, "c++", opts()), "cubin", cache=cache, extra_digest=0)


# -- hits for every target type, and the PTX loadability warning ----------------------


def _seed(cache: InMemoryProgramCache, code: str, code_type: str, target: str, data: bytes) -> Any:
    o = opts()
    k = make_program_cache_key(code=code, code_type=code_type, options=o, target_type=target)
    cache[k] = data
    return CompileInputs(code, code_type, o)


class _NeverBuilt(CompileInputs):
    def new_program(self) -> Any:
        raise AssertionError("the compiler ran on a hit")


@pytest.mark.parametrize("target", ["cubin", "ptx", "ltoir"])
def test_hit_rebuilds_the_right_object_code_type(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_ptxcheck, "driver_version", lambda: 10**6)
    cache = InMemoryProgramCache()
    inputs = _seed(cache, PLAIN, "c++", target, b"payload-" + target.encode())
    obj = cached_compile(_NeverBuilt(*vars(inputs).values()), target, cache=cache)
    assert obj.code_type == target
    assert bytes(obj.code) == b"payload-" + target.encode()


def _ptx_hit(cache: InMemoryProgramCache, code_type: str = "c++", target: str = "ptx") -> Any:
    code = PLAIN if code_type == "c++" else ".version 8.0\n"
    inputs = _seed(cache, code, code_type, target, b"// cached ptx\n")
    return cached_compile(_NeverBuilt(*vars(inputs).values()), target, cache=cache)


def test_ptx_hit_warns_when_the_driver_is_older_than_nvrtc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ptxcheck, "nvrtc_version", lambda: (13, 5))
    monkeypatch.setattr(_ptxcheck, "driver_version", lambda: 12080)
    with pytest.warns(RuntimeWarning, match="older than NVRTC 13.5") as record:
        _ptx_hit(InMemoryProgramCache())
    assert record[0].filename == __file__  # attributed to the caller, like the uncached warning


@pytest.mark.parametrize(
    ("driver", "code_type", "target"),
    [(13050, "c++", "ptx"), (13100, "c++", "ptx"), (12080, "c++", "cubin"), (12080, "ptx", "ptx")],
)
def test_no_warning_when_the_uncached_compile_would_not_warn(
    monkeypatch: pytest.MonkeyPatch, driver: int, code_type: str, target: str
) -> None:
    monkeypatch.setattr(_ptxcheck, "nvrtc_version", lambda: (13, 5))
    monkeypatch.setattr(_ptxcheck, "driver_version", lambda: driver)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _ptx_hit(InMemoryProgramCache(), code_type, target)


def test_no_warning_when_the_driver_cannot_be_queried(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_driver() -> int:
        raise OSError("libcuda.so not found")

    monkeypatch.setattr(_ptxcheck, "driver_version", no_driver)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bytes(_ptx_hit(InMemoryProgramCache()).code) == b"// cached ptx\n"


def test_key_memo_never_serves_a_stale_key_after_options_change(counting: type) -> None:
    cache = InMemoryProgramCache()
    o = opts(define_macro=["A=1"])
    inputs = counting(PLAIN, "c++", o)
    cached_compile(inputs, "cubin", cache=cache)
    cached_compile(inputs, "cubin", cache=cache)
    assert len(counting.built) == 1
    o.define_macro.append("B=2")  # mutated in place
    cached_compile(inputs, "cubin", cache=cache)
    o.debug = True  # replaced
    cached_compile(inputs, "cubin", cache=cache)
    assert len(counting.built) == 3
    assert len(cache) == 3


def test_key_memo_follows_the_toolchain_probes(
    counting: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nexus_cache.program.keys import _probes, clear_probe_cache

    cache = InMemoryProgramCache()
    inputs = counting(PLAIN, "c++", opts())
    cached_compile(inputs, "cubin", cache=cache)
    monkeypatch.setattr(_probes, "_nvrtc", lambda: "13.5;lib=another-build")
    clear_probe_cache()
    try:
        cached_compile(inputs, "cubin", cache=cache)
    finally:
        monkeypatch.undo()
        clear_probe_cache()
    assert len(counting.built) == 2  # a different NVRTC build: a different key


# -- one key per call, memoized per Program -----------------------------------


def test_a_plain_program_hit_derives_no_cuda_core_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from nexus_cache.program import _delegate

    derived: list[int] = []
    real = _delegate._peer_key

    def counting_peer_key(program: Any, target_type: str) -> bytes:
        derived.append(1)
        return real(program, target_type)

    monkeypatch.setattr(_delegate, "_peer_key", counting_peer_key)
    cache = InMemoryProgramCache()
    program = core.Program(PLAIN, "c++", opts(name="plain-k"))
    fresh = cached_compile(program, "cubin", cache=cache)
    hits = [cached_compile(program, "cubin", cache=cache) for _ in range(5)]
    assert derived == [1]  # the first call only
    assert len(cache) == 1  # the name comes from the options: no sidecar needed
    assert all(bytes(h.code) == bytes(fresh.code) and h.name == "plain-k" for h in hits)


def test_the_program_memo_follows_its_options_object(monkeypatch: pytest.MonkeyPatch) -> None:
    # A Program reads its options object when it compiles: changing a field
    # (or a list in place) after a hit must give the key of the new compile.
    cache = InMemoryProgramCache()
    options = opts(define_macro=["A=1"])
    program = core.Program(PLAIN, "c++", options)
    first = cached_compile(program, "cubin", cache=cache)
    cached_compile(program, "cubin", cache=cache)
    assert len(cache) == 1
    options.define_macro.append("B=2")
    cached_compile(program, "cubin", cache=cache)
    assert len(cache) == 2
    options.arch = "sm_80"
    second = cached_compile(program, "cubin", cache=cache)
    assert len(cache) == 3
    assert bytes(second.code) != bytes(first.code)
    # back to the first options: the first entry is found again
    options.arch = "sm_90"
    options.define_macro = ["A=1"]
    assert bytes(cached_compile(program, "cubin", cache=cache).code) == bytes(first.code)
    assert len(cache) == 3


def test_make_program_cache_key_memo_compares_options_by_value() -> None:
    o = opts(define_macro=["A=1"])
    k1 = make_program_cache_key(code=PLAIN, code_type="c++", options=o, target_type="cubin")
    assert (
        make_program_cache_key(code=PLAIN, code_type="c++", options=o, target_type="cubin") == k1
    )
    o.define_macro.append("B=2")  # in place
    k2 = make_program_cache_key(code=PLAIN, code_type="c++", options=o, target_type="cubin")
    assert k2 != k1
    equal = opts(define_macro=["A=1", "B=2"])  # another object, equal fields
    assert (
        make_program_cache_key(code=PLAIN, code_type="c++", options=equal, target_type="cubin")
        == k2
    )
    o.debug = True
    assert (
        make_program_cache_key(code=PLAIN, code_type="c++", options=o, target_type="cubin") != k2
    )


# Python equality ignores these types, the compiler's flags do not: cuda.core
# emits --split-compile=False (refused by NVRTC) and --split-compile=0,
# --frandom-seed=True and --frandom-seed=1, --maxrregcount=32.0 and =32.
EQUAL_BUT_OTHER_FLAGS = [
    ("split_compile", 0, False),
    ("frandom_seed", 1, True),
    ("max_register_count", 32, 32.0),
    ("diag_suppress", [1], [True]),
    ("diag_suppress", [1], [1.0]),
]


@pytest.mark.parametrize(("field", "first", "second"), EQUAL_BUT_OTHER_FLAGS)
def test_key_memo_tells_equal_values_of_other_types_apart(
    field: str, first: Any, second: Any
) -> None:
    a, b = opts(**{field: first}), opts(**{field: second})
    assert a.as_bytes("nvrtc", "cubin") != b.as_bytes("nvrtc", "cubin")  # other flags
    ka = make_program_cache_key(code=PLAIN, code_type="c++", options=a, target_type="cubin")
    kb = make_program_cache_key(code=PLAIN, code_type="c++", options=b, target_type="cubin")
    assert ka != kb
    # and each is the key a fresh derivation gives (in either order)
    kb2 = make_program_cache_key(code=PLAIN, code_type="c++", options=b, target_type="cubin")
    ka2 = make_program_cache_key(code=PLAIN, code_type="c++", options=a, target_type="cubin")
    assert (ka2, kb2) == (ka, kb)


def test_the_program_memo_tells_equal_values_of_other_types_apart() -> None:
    # split_compile=0 compiles; split_compile=False makes NVRTC refuse the
    # option. A hit under the first key must not hide the second's error.
    cache = InMemoryProgramCache()
    options = opts(split_compile=0)
    program = core.Program(PLAIN, "c++", options)
    cached_compile(program, "cubin", cache=cache)
    options.split_compile = False
    with pytest.raises(Exception, match="split-compile"):
        cached_compile(program, "cubin", cache=cache)
    assert len(cache) == 1


def test_the_program_memo_keeps_no_program_alive_and_never_confuses_two() -> None:
    import gc
    import weakref

    cache = InMemoryProgramCache()
    options = opts()
    first = core.Program(PLAIN, "c++", options)
    cached_compile(first, "cubin", cache=cache)
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None  # the memo held no reference
    # Many new Programs with the same options object and other code (ids get
    # reused): each must get its own key.
    for i in range(20):
        src = f'extern "C" __global__ void k{i}(int *a) {{ *a = {i}; }}\n'
        obj = cached_compile(core.Program(src, "c++", options), "cubin", cache=cache)
        assert f"k{i}".encode() in bytes(obj.code)
    assert len(cache) == 21

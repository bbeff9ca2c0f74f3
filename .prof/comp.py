import random, os, sys, time, statistics, timeit, hashlib, tempfile, shutil
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
import xxhash
from nexus_cache.program import FileStreamProgramCache, _filestream, _stamps
from nexus_cache.program._memo import VerifiedMemo
from nexus_cache.program._counters import OpCounters
d = os.urandom(16384); k = b"k"*32; dg = hashlib.sha256(k).digest()
def t(name, f, n=100000):
    v = min(timeit.repeat(f, number=n, repeat=5))/n*1e9; print(f"{name:28} {v:7.0f} ns")
h = dg.hex()
t("sha hexdigest", lambda: hashlib.sha256(k).hexdigest())
t("sha+hex+concat", lambda: (lambda h: "/x/" + h[:2] + "/" + h)(hashlib.sha256(k).digest().hex()))
t("xxh3 16K seeded", lambda: xxhash.xxh3_64_intdigest(d, int.from_bytes(dg[:8], "little")))
t("xxh3 16K", lambda: xxhash.xxh3_64_intdigest(d))
t("int(h[:16],16)", lambda: int(h[:16], 16))
t("from_bytes", lambda: int.from_bytes(dg[:8], "big"))
from nexus_cache.program._integrity import mtime_matches
h = dg.hex(); t("mtime_matches", lambda: mtime_matches(123, d, h))
m = VerifiedMemo(1 << 25); ks = [b"k%031d" % i for i in range(50000)]; it = iter(range(10**9))
t("memo.get miss", lambda: m.get(k))
t("second_read", lambda: m.second_read(ks[next(it) % 50000], 12345678, 1796319435698043358))
c = OpCounters(); t("counts.hit", c.hit)
t("time_ns", time.time_ns)
_stamps.DELAY_S = 1000
t("defer", lambda: _stamps.defer(("/nonexistent", 1, 2, 3)), 20000)
_stamps._queue.items.clear()
t("noop lambda", lambda: None)
root = tempfile.mkdtemp()
n = 3000
keys = [b"k%031d" % i for i in range(n)]
c0 = FileStreamProgramCache(root)
for kk in keys: c0[kk] = d
a = time.time_ns() - 3600 * 10**9
for dp, _, fs in os.walk(root):
    for f in fs:
        p = os.path.join(dp, f); os.utime(p, ns=(a, os.lstat(p).st_mtime_ns))
class NoCount:
    def hit(self): pass
X = {"as-is": FileStreamProgramCache(root), "nomemo": FileStreamProgramCache(root, memory_bytes=0),
     "nomemo-nocount": FileStreamProgramCache(root, memory_bytes=0), "nomemo-nocount-nodefer": FileStreamProgramCache(root, memory_bytes=0)}
class Stub:
    get = {}.get
    def second_read(self, *a): return False
X["memo-stub"] = FileStreamProgramCache(root, memory_bytes=0); X["memo-stub"]._memo = Stub()
X["nomemo-nocount"]._counts = NoCount(); X["nomemo-nocount-nodefer"]._counts = NoCount()
paths = [c0._path_for(kk) for kk in keys]
clock = time.perf_counter_ns
names = ["floor"] + list(X); res = {k: [] for k in names}
real = _filestream._defer_stamp
for i in range(0, n - 6, 6):
    order = names[:]; random.shuffle(order)
    for j, name in enumerate(order):
        kk = i + j
        if name == "nomemo-nocount-nodefer": _filestream._defer_stamp = lambda s: None
        t0 = clock()
        if name == "floor":
            fd = os.open(paths[kk], os.O_RDONLY | os.O_CLOEXEC); st = os.fstat(fd); os.read(fd, st.st_size); os.close(fd)
        else:
            X[name].get(keys[kk])
        res[name].append(clock() - t0)
        _filestream._defer_stamp = real
fl = statistics.median(res["floor"])
for kx, v in res.items(): print(f"{kx:26} {statistics.median(v)/1000:6.2f} us {statistics.median(v)/fl:5.2f}")
_stamps._queue.items.clear()
shutil.rmtree(root)

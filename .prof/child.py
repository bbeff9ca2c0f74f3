import os, sys, time, statistics, tempfile, shutil
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from nexus_cache.program import FileStreamProgramCache
root = tempfile.mkdtemp(); n = 2000
keys = [b"fresh%027d" % i for i in range(n)]
d = os.urandom(16384)
c0 = FileStreamProgramCache(root)
for k in keys: c0[k] = d
def age():
    a = time.time_ns() - 3600 * 10**9
    for dp, _, fs in os.walk(root):
        for f in fs:
            p = os.path.join(dp, f); os.utime(p, ns=(a, os.lstat(p).st_mtime_ns))
clock = time.perf_counter_ns
def run(same_file, label):
    age()
    cache = FileStreamProgramCache(root)
    paths = [cache._path_for(k) for k in keys]
    ours, floor, ours1, ours2 = [], [], [], []
    def read_ours(i):
        t0 = clock(); cache.get(keys[i]); dt = clock() - t0; ours.append(dt); return dt
    def read_floor(i):
        t0 = clock(); fd = os.open(paths[i], os.O_RDONLY | os.O_CLOEXEC); st = os.fstat(fd); os.read(fd, st.st_size); os.close(fd); floor.append(clock() - t0)
    if same_file:
        for i in range(n):
            if i % 2:
                ours1.append(read_ours(i)); read_floor(i)
            else:
                read_floor(i); ours2.append(read_ours(i))
    else:
        for i in range(0, n - 1, 2):
            if i % 4: read_ours(i); read_floor(i + 1)
            else: read_floor(i); read_ours(i + 1)
    f = statistics.median(floor)
    extra = f" ours-first {statistics.median(ours1)/1000:.2f} ours-second {statistics.median(ours2)/1000:.2f}" if same_file else ""
    print(f"{label}: ours {statistics.median(ours)/1000:.2f} floor {f/1000:.2f} ratio {statistics.median(ours)/f:.3f}{extra}")
run(True, "same file"); run(False, "other file"); run(True, "same file"); run(False, "other file")
shutil.rmtree(root)

import os, sys, time, statistics, random
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from nexus_cache.program._memo import VerifiedMemo
clock = time.perf_counter_ns
m = VerifiedMemo(1 << 25)
keys = [os.urandom(32) for _ in range(3000)]
g, sr, e = [], [], []
for k in keys:
    t = clock(); m.get(k); g.append(clock() - t)
    t = clock(); m.second_read(k, 1234567, 1796319435698043358); sr.append(clock() - t)
    t = clock(); e.append(clock() - t)
print("get", statistics.median(g), "second_read", statistics.median(sr), "empty", statistics.median(e))

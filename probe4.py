import json, threading, time, pyarrow.flight as fl
def run(i):
    c = fl.connect("grpc://127.0.0.1:18818")
    t0=time.time()
    try:
        t = c.do_get(fl.Ticket(json.dumps({"type":"count","source":"/tmp/advsrv/data/big.parquet"}).encode())).read_all()
        print(i, "OK", time.time()-t0)
    except Exception as e:
        print(i, type(e).__name__, str(e)[:200])
ts=[threading.Thread(target=run,args=(i,)) for i in range(3)]
[t.start() or time.sleep(0.05) for t in ts]; [t.join() for t in ts]

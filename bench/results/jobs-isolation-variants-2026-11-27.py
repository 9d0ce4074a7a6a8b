import subprocess, time, concurrent.futures, sys, statistics
IMG="gpulab/python:3.11"
BASE=["docker","run","--rm","--cpus","0.25","--memory","256m","--user","1000:100"]
subprocess.run(["docker","network","create","vt-net"],capture_output=True)
V={
 "bare": [],
 "net": ["--network","vt-net"],
 "hard": ["--cap-drop","ALL","--security-opt","no-new-privileges:true","--pids-limit","1024"],
 "ro+tmpfs": ["--read-only","--tmpfs","/tmp:rw,nosuid,nodev,size=1g,mode=1777"],
 "all": ["--network","vt-net","--cap-drop","ALL","--security-opt","no-new-privileges:true","--pids-limit","1024","--read-only","--tmpfs","/tmp:rw,nosuid,nodev,size=1g,mode=1777","--log-opt","max-size=10m","--log-opt","max-file=3"],
}
N=int(sys.argv[1]) if len(sys.argv)>1 else 48
res={k:[] for k in V}
for rnd in range(2):
  for k,extra in V.items():
    t=time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(16) as p:
        list(p.map(lambda _: subprocess.run([*BASE,*extra,IMG,"true"],check=True,capture_output=True), range(N)))
    res[k].append(time.perf_counter()-t)
for k,v in res.items(): print(k, ["%.1f"%x for x in v], "mean %.1f"%statistics.mean(v))
subprocess.run(["docker","network","rm","vt-net"],capture_output=True)

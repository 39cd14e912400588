import json, sys, psutil
p = psutil.Process(int(sys.argv[1]))
out = {}
for q in [p, *p.children(recursive=True)]:
    try:
        cmd = " ".join(q.cmdline())
        t = q.cpu_times()
        key = f"{q.pid} {cmd[:150]}"
        out[key] = t.user + t.system
    except psutil.Error:
        pass
json.dump(out, sys.stdout)

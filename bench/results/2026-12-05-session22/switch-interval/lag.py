"""Print loop-lag quantiles (from histogram buckets) of each service's metrics, delta between two scrapes."""
import sys, urllib.request, glob, re, json, time, os
run = sys.argv[1]
def scrape():
    out = {}
    for f in sorted(glob.glob(f"{run}/*.ready")):
        name = os.path.basename(f)[:-6]
        port = open(f).read().split()[1]
        try:
            txt = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except Exception:
            continue
        b = {}
        for m in re.finditer(r'meshserve_event_loop_lag_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', txt):
            b[m.group(1)] = float(m.group(2))
        out[name] = b
    return out
if __name__ == "__main__":
    a = scrape(); time.sleep(float(sys.argv[2])); b = scrape()
    for name in b:
        d = {k: b[name][k] - a.get(name, {}).get(k, 0) for k in b[name]}
        n = d.get("+Inf", 0)
        if not n: continue
        def q(p):
            for k, v in d.items():
                if v >= p * n: return k
        print(f"{name:10s} n={n:.0f} p50<={q(.5)} p90<={q(.9)} p99<={q(.99)} >10ms={(n-d['0.01'])/n:.3f} >20ms={(n-d['0.02'])/n:.3f}")

import sys, urllib.request, re, time, subprocess
run, cmd = sys.argv[1], sys.argv[2:]
port = open(f"{run}/gateway.ready").read().split()[1]
def scrape():
    txt = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'meshserve_gateway_time_to_first_token_seconds_bucket\{le="([^"]+)"\} ([0-9.e+]+)', txt)}
a = scrape(); print(subprocess.run(cmd, capture_output=True, text=True).stdout.strip()); b = scrape()
d = {k: b[k]-a.get(k,0) for k in b}; n = d["+Inf"]
print("  gateway-side TTFT: n=%d <=1ms %.3f <=5ms %.3f <=10ms %.3f <=20ms %.3f" % (n, d["0.001"]/n, d["0.005"]/n, d["0.01"]/n, d["0.02"]/n))

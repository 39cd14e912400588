"""One mesh, interleaved sequential streaming chat requests: sampled (no traceparent: the edge samples
at its ratio) against unsampled (a caller's traceparent with flags 00, followed by every hop). Median TTFT each."""
import http.client, json, os, statistics, sys, time
n = int(sys.argv[1]); port = int(sys.argv[2]) if len(sys.argv) > 2 else 8080
conn = http.client.HTTPConnection("127.0.0.1", port)
res = {"sampled": [], "unsampled": []}
for i in range(n):
    for name in res:
        headers = {"content-type": "application/json"}
        if name == "unsampled":
            headers["traceparent"] = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-00"
        body = json.dumps({"model": "meshserve-tiny", "stream": True, "max_tokens": 4, "temperature": 1.0,
            "messages": [{"role": "user", "content": f"request {i} tell me a story about the sea and ships {i*7919}"}]})
        t0 = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body, headers)
        r = conn.getresponse(); first = None
        while True:
            line = r.readline()
            if not line: break
            if line.startswith(b"data:") and first is None: first = time.perf_counter()
            if line.startswith(b"data: [DONE]"): break
        r.read()
        assert r.status == 200 and first, (name, r.status)
        if i >= 20: res[name].append((first - t0) * 1000)
for name, v in res.items():
    print(f"{name:10s} p50 {statistics.median(v):.3f} mean {statistics.mean(v):.3f} ms")

"""Interleaved sequential streaming chat requests over several targets (PORT[:PATH]); median TTFT each."""
import http.client, json, sys, time, statistics
n = int(sys.argv[1]); targets = []
for t in sys.argv[2:]:
    port, _, path = t.partition(":")
    targets.append((t, http.client.HTTPConnection("127.0.0.1", int(port)), path or "/v1/chat/completions"))
res = {t[0]: [] for t in targets}
for i in range(n):
    for name, conn, path in targets:
        body = json.dumps({"model": "meshserve-tiny", "stream": True, "max_tokens": 4, "temperature": 1.0,
            "messages": [{"role": "user", "content": f"request {i} tell me a story about the sea and ships {i*7919}"}]})
        t0 = time.perf_counter()
        conn.request("POST", path, body, {"content-type": "application/json"})
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
    print(f"{name:30s} p50 {statistics.median(v):.3f} mean {statistics.mean(v):.3f} ms")

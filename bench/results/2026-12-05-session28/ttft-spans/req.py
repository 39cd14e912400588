import json, time, http.client, random, sys
words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 8080)
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 20):
    body = {"model": "meshserve-tiny", "messages": [{"role": "user", "content": " ".join(random.choice(words) for _ in range(60))}],
            "max_completion_tokens": 32, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0 if "greedy" in sys.argv else 1.0}
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    first = None; n = 0
    while True:
        line = r.readline()
        if not line: break
        if line.startswith(b"data: ") and first is None: first = time.perf_counter()
        n += 1
        if line.startswith(b"data: [DONE]"): break
    r.read()
    end = time.perf_counter()
    print(f"ttft {1000*(first-t0):.2f} ms total {1000*(end-t0):.1f} ms lines {n} trace {r.getheader('x-trace-id')}")

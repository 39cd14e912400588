import socket, os, sys, time, resource
kind = sys.argv[1]
N = 200000
msg = b"x" * 300
if kind == "tcp":
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
    addr = srv.getsockname()
else:
    path = "/tmp/mb/s.sock"
    if os.path.exists(path): os.unlink(path)
    srv = socket.socket(socket.AF_UNIX); srv.bind(path); srv.listen(1); addr = path
pid = os.fork()
if pid == 0:
    c = socket.socket(socket.AF_INET if kind == "tcp" else socket.AF_UNIX); c.connect(addr)
    total = 0
    while total < N * 300:
        d = c.recv(65536)
        if not d: break
        total += len(d)
    os._exit(0)
conn, _ = srv.accept()
if kind == "tcp": conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
r0 = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(N): conn.send(msg)
r1 = resource.getrusage(resource.RUSAGE_SELF)
os.waitpid(pid, 0)
cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
print(kind, "sender us/msg", round(cpu / N * 1e6, 2), "sys", round((r1.ru_stime - r0.ru_stime)/N*1e6, 2))

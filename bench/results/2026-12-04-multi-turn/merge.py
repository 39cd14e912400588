"""Medians over the rounds of two bench/routing.py outputs (rows.json), as routing.summary writes them."""
import json, sys
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench import routing
rows = {}
for f in sys.argv[2:]:
    for k, v in json.loads(Path(f).read_text()).items():
        s, p = k.split("/", 1)
        rows.setdefault((s, p), []).extend(v)
scen = [routing.SCENARIOS[s] for s in dict.fromkeys(s for s, _ in rows)]
pols = list(dict.fromkeys(p for _, p in rows))
Path(sys.argv[1]).write_text(routing.summary(rows, scen, pols))
print(routing.summary(rows, scen, pols))

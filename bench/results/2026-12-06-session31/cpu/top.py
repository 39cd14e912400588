import sys
from collections import Counter
for name in sys.argv[1:]:
    own, incl = Counter(), Counter()
    total = 0
    for line in open(f"{name}.txt"):
        stack, _, n = line.rstrip().rpartition(" ")
        n = int(n); total += n
        frames = stack.split(";")
        own[frames[-1]] += n
        for f in set(frames):
            incl[f] += n
    print(f"== {name}: {total} samples; top self")
    for f, n in own.most_common(12):
        print(f"  {100*n/total:5.1f}%  {f[:140]}")
    print("  top inclusive")
    for f, n in incl.most_common(30):
        print(f"  {100*n/total:5.1f}%  {f[:140]}")

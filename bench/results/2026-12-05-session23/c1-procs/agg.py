import sys, collections
f = sys.argv[1]; depth = int(sys.argv[2]) if len(sys.argv) > 2 else 0
tot = collections.Counter(); self_ = collections.Counter(); n = 0; threads = collections.Counter()
for line in open(f):
    stack, _, c = line.rstrip().rpartition(" "); c = int(c); n += c
    frames = stack.split(";")
    threads[frames[0][:60]] += c
    leaf = frames[-1]; self_[leaf] += c
    for fr in set(frames[1:]): tot[fr] += c
print("samples", n)
print("threads:", threads.most_common(6))
print("-- self"); [print(f"{v:6d} {v/n:6.1%} {k[:150]}") for k, v in self_.most_common(25)]
print("-- inclusive"); [print(f"{v:6d} {v/n:6.1%} {k[:150]}") for k, v in tot.most_common(45)]

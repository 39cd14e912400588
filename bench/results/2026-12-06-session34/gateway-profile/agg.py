import sys
from collections import Counter
incl=Counter(); selfc=Counter(); total=0; idle=0
for line in open(sys.argv[1]):
    stack,_,n=line.rstrip().rpartition(' ')
    n=int(n); total+=n
    frames=stack.split(';')
    if 'select' in frames[-1] and 'selectors' in frames[-1]: idle+=n
    seen=set()
    for f in frames:
        key=f.split(' (')[0]+' @'+f.rsplit('/',1)[-1].rstrip(')') if '/' in f else f
        k2=f.split(' (')[0]+' '+(f.split('(')[1].split(':')[0].rsplit('/',1)[-1] if '(' in f else '')
        if k2 not in seen: incl[k2]+=n; seen.add(k2)
    selfc[frames[-1].split(' (')[0]+' '+(frames[-1].split('(')[1].split(':')[0].rsplit('/',1)[-1] if '(' in frames[-1] else '')]+=n
print('total',total,'idle(select)',idle)
for k,v in incl.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 60): print(f"{v/total*100:5.1f} {k[:140]}")
print('--- self')
for k,v in selfc.most_common(30): print(f"{v/total*100:5.1f} {k[:140]}")

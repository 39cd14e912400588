import json,glob,sys
for f in sorted(glob.glob(sys.argv[1]+'/runs/*/bench.json')):
    d=json.load(open(f)); t=d['timings']
    st=t['start_ms']; tt=t['ttft_ms']
    n=len(st); order=sorted(range(n), key=lambda i: st[i])
    q=[order[i*n//8:(i+1)*n//8] for i in range(8)]
    srt=sorted(tt); p99=srt[int(0.99*n)]
    top=[i for i in range(n) if tt[i]>=p99]
    print(f.split('/')[-2], 'p99',round(p99), 'dur', round(max(st)/1000,1), 'octile means', [round(sum(tt[i] for i in g)/len(g)) for g in q], 'p99 starts', sorted(round(st[i]/1000,1) for i in top)[::3])

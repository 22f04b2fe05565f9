import re, sys
def het(f):
    h={}
    for l in open(f):
        p=l.split()
        if len(p)==4 and re.match(r'(conv|fc|gap|prob)\d+',p[0]): h[p[0]]=(float(p[1]),float(p[2]))
    return h
def ort(f):
    o=[]
    for l in open(f):
        p=l.split()
        if len(p)==2 and not l.startswith(('whole','sum')): o.append((p[0],float(p[1])))
    return o
h=het(sys.argv[1]); o=ort(sys.argv[2])
onodes=[x for x in o if x[0].endswith('_nchwc') and not x[0].startswith('gap')]
kinds=['stem','dw','proj']+['exp','dw','proj']*16+['last']
tot={}; rows=[]
for k,(n,t) in enumerate(onodes,1):
    hn='conv%d'%k; hr=h[hn][0]; kd=kinds[k-1]
    tot.setdefault(kd,[0,0]); tot[kd][0]+=hr; tot[kd][1]+=t
    rows.append((hr-t,hn,n,kd,hr,t))
fc=dict(o).get('fc1'); print('fc1', h['fc1'][0], fc)
for d,hn,n,kd,hr,t in sorted(rows)[-12:]: print(f"{hn:7s} {kd:5s} het {hr:.3f} ort {t:.3f} {d*1e3:+.0f} us")
print({k:(round(a,3),round(b,3)) for k,(a,b) in tot.items()})

import os,sys,heapq,numpy as np,jax,jax.numpy as jnp
from jaxspec.ddtree import build_tree,top_k_method
print(jax.devices(),os.environ.get("JAXSPEC_DDTREE_TOP_K"))
for n,k in [(8192,100),(5000,8),(20000,64),(4097,300)]:
  i=np.asarray(jax.lax.top_k(jnp.zeros((3,n)),k)[1]);print("topk stable",n,k,(i==np.arange(k)).all())
def heap(lp,B):
  D,V=lp.shape;K=min(B,V);o=[np.argsort(-lp[d].astype(np.float64),kind="stable")[:K] for d in range(D)]
  t=[lp[d][o[d]] for d in range(D)];h=[(-float(t[0][0]),(0,),0,np.float32(0))];out=[]
  while h and len(out)<B:
    ns,r,p,ps=heapq.heappop(h);s=np.float32(-ns);d=len(r)
    out.append(((out[p-1][0] if p else ())+(int(o[d-1][r[-1]]),),p,d,s));me=len(out)
    if r[-1]+1<K:
      x=np.float32(ps+t[d-1][r[-1]+1]);heapq.heappush(h,(-float(x),r[:-1]+(r[-1]+1,),p,ps))
    if d<D:
      x=np.float32(s+t[d][0]);heapq.heappush(h,(-float(x),r+(0,),me,s))
  return [x for x in out if x[3]>-np.inf]
rng=np.random.default_rng(0);bad=0;tot=0
for V,D,B in [(300,15,128),(300,15,300),(5000,6,64),(5000,15,512),(70,15,100),(2000,15,65)]:
  lp=-(rng.integers(0,3,size=(4,D,V))/4.).astype(np.float32)
  lp[1]=np.where(rng.random((D,V))<.5,-np.inf,lp[1]);lp[2,:,:]=-8.;lp[2,:,5]=0.
  lp[3]=np.float32(-3.)-rng.random((D,V)).astype(np.float32);lp[3,::2,7]=0.
  t=build_tree(jnp.asarray(lp),jnp.zeros(4,jnp.int32),B)
  tok,par,dep,val,anc=map(np.asarray,(t.tokens,t.tree.parent,t.tree.depth,t.valid,t.tree.anc))
  for r in range(4):
    tot+=1;ref=heap(lp[r],B);P={0:()};got=[];e=[]
    for i in range(1,B+1):
      if not(0<=par[r,i]<i):e.append("order")
      if val[r,i]:
        P[i]=P[par[r,i]]+(int(tok[r,i]),);got.append(P[i])
        if dep[r,i]!=dep[r,par[r,i]]+1:e.append("depth")
    if got!=[x[0] for x in ref] or list(par[r,1:len(got)+1])!=[x[1] for x in ref]:e.append("pop order")
    if anc[r].sum()!=sum(dep[r][val[r]]+1)+2*(~val[r]).sum():e.append("anc")
    if e:bad+=1;print("FAIL",V,D,B,r,sorted(set(e)),len(got),len(ref))
print("gpu",top_k_method(5000),tot,"rows",bad,"failures")

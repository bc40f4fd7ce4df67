import torch, time, sys
import torch.nn.functional as F
threads=int(sys.argv[1]); torch.set_num_threads(threads)
b,h,s,d=[int(x) for x in sys.argv[2:6]]; dt={'fp32':torch.float32,'bf16':torch.bfloat16}[sys.argv[6]]; causal=int(sys.argv[7])
q=torch.randn(b,h,s,d,dtype=dt,requires_grad=True); k=torch.randn(b,h,s,d,dtype=dt,requires_grad=True); v=torch.randn(b,h,s,d,dtype=dt,requires_grad=True)
with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
    o=F.scaled_dot_product_attention(q,k,v,is_causal=bool(causal)); g=torch.randn_like(o)
    best=1e9; cpu=0
    for r in range(4):
        o=F.scaled_dot_product_attention(q,k,v,is_causal=bool(causal))
        c0=time.process_time(); t0=time.perf_counter(); torch.autograd.grad(o,(q,k,v),g); w=time.perf_counter()-t0
        if w<best: best=w; cpu=time.process_time()-c0
print(f"torch bwd b={b} h={h} s={s} d={d} {sys.argv[6]} causal={causal} threads={threads}: {best*1e3:.2f} ms, cpu {cpu*1e3:.2f} ms")

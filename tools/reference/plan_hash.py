#!/usr/bin/env python3
"""The layout hash of the `seed` model's plan at W = 4 (first line) and its model hash (second
line), computed independently of the C++ planner
from the byte stream sharding/shard_planner.h documents (plan format v2). The planner test pins
the value this prints; run it after any change to the hash's input format."""
import struct
class F:
    def __init__(s): s.h=0xcbf29ce484222325
    def b(s,x):
        s.h^=x; s.h=(s.h*0x100000001b3)&0xFFFFFFFFFFFFFFFF
    def u64(s,v):
        v&=0xFFFFFFFFFFFFFFFF
        for i in range(8): s.b((v>>(8*i))&0xff)
    def s_(s,t):
        s.u64(len(t))
        for c in t.encode(): s.b(c)
    def f32(s,x): s.u64(struct.unpack('<I',struct.pack('<f',x))[0])
    def f64(s,x): s.u64(struct.unpack('<Q',struct.pack('<d',x))[0])
h=F()
h.s_("zeroshard.shard_plan.v2"); h.u64(4); h.u64(4194304); h.u64(4)
T=[("2.bias",[10],10),("2.weight",[10,64],640),("0.bias",[64],64),("0.weight",[64,10],640)]
for n,sh,ne in T:
    h.s_(n); h.u64(len(sh)); [h.u64(d) for d in sh]; h.u64(ne); h.f64(0.0); h.f32(1.0)
for off in [0,64,704,768]:
    h.u64(off); h.u64(0); h.u64(1)
h.u64(1)
for v in [0,1408,352,0,4,1354]: h.u64(v)
h.u64(1408)
print(hex(h.h))
# The model hash (ShardPlan::model_hash): the same at every world size and bucket size.
m=F()
m.s_("zeroshard.model.v1"); m.u64(len(T))
for n,sh,ne in T:
    m.s_(n); m.u64(len(sh)); [m.u64(d) for d in sh]; m.u64(ne)
print(hex(m.h))

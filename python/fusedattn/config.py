"""Global switches of fusedattn.

Dynamo guards on these module attributes, so flipping one between calls of a
compiled function makes it recompile rather than reuse a stale graph.
"""

#: Run every fusedattn call eagerly, outside any torch.compile graph. Under
#: ``torch.compile`` each gated call then graph-breaks (with
#: ``fullgraph=True`` compilation fails) and warns with the reason. Meant for
#: debugging: comparing compiled and eager numerics, or isolating a compile issue.
force_eager: bool = False

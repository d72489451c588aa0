"""``crescent sim``: Crescent's scheduler and tierd's eviction policies, imported from the
services, replayed over request traces at cluster scale (no second implementation of either).

The cache side: ``pool.BlockPool`` (a global KV pool evicting by a tierd policy through its
incremental victim index), ``belady`` (the offline optimum, the bound for every policy),
``hitrate`` (hit rates of policies by capacity: ``python -m crescent.sim.hitrate``),
``synthetic`` (workloads beyond the trace) and ``reuse_stats`` (how a trace's blocks come back).
"""

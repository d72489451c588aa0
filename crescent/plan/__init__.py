"""``crescent plan``: sizes a cluster for its objectives. ``search`` finds the fewest prefill
and decode nodes meeting them with as few simulations as it can (``shapes``: what it works
on and answers), ``evaluate`` simulates one
shape with ``crescent.sim``, ``workload`` describes a workload by its figures, ``observe`` and
``live`` read one from a running cluster, and ``scale`` turns a plan into ``kubectl`` commands.
"""

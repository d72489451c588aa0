"""``python -m crescent.sim``: the same as ``crescent sim``."""

from crescent.sim.cli import main

raise SystemExit(main())

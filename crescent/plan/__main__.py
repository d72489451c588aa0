"""``python -m crescent.plan``: the same as ``crescent plan``."""

from crescent.plan.cli import main

raise SystemExit(main())

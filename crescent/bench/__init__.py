"""``crescent bench``: a load generator for any OpenAI-compatible completions server.

``options`` parses the command line (light: argparse only, so ``crescent --help`` stays fast),
``workload`` turns a trace or a synthetic recipe into requests, ``client`` streams one request
and times it, ``runner`` paces a workload against a server, ``metrics`` reduces the records to
figures (pure functions), ``report`` and ``plots`` write them, and ``main`` ties them together,
one target or two in turns (``--compare``).
"""

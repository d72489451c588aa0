"""kvindex: the KV events of every publisher in per-tier views, and prefix queries over HTTP."""

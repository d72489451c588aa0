"""Where a full hit's time goes, by the gateway's own account (``GET /debug/requests/{id}``).

Sends one long prompt to a running stack, then the same prompt again a few times (each with a
different last word, so all but the last tokens are found cached), and prints each request's
wall time, its cached tokens and its phases as the gateway timed them:

    .venv/bin/crescent up --model <the 1b gguf> --port 8011 --data-dir /tmp/hitdata &
    .venv/bin/python bench/hit_phases.py --url http://127.0.0.1:8011
"""

from __future__ import annotations

import argparse
import random
import time

import httpx

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--words", type=int, default=1300, help="the shared prompt's length")
    parser.add_argument("--requests", type=int, default=4, help="the first one is cold")
    args = parser.parse_args()
    rng = random.Random(1)
    prompt = " ".join(rng.choice(WORDS) for _ in range(args.words))
    with httpx.Client(base_url=args.url, timeout=600) as client:
        model = client.get("/v1/models").json()["data"][0]["id"]
        for i in range(args.requests):
            body = {"model": model, "prompt": f"{prompt} q{i}", "max_tokens": 4, "temperature": 0}
            start = time.perf_counter()
            answer = client.post("/v1/completions", json=body).json()
            wall_ms = (time.perf_counter() - start) * 1000
            usage = answer["usage"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            print(f"request {i}: {wall_ms:.1f} ms, {cached}/{usage['prompt_tokens']} cached")
            debug = client.get(f"/debug/requests/{answer['id']}").json()
            print(f"  placed: {debug.get('placed')}")
            for phase, seconds in debug.get("phases_s", {}).items():
                print(f"  {phase:>18}: {seconds * 1000:9.1f} ms")


if __name__ == "__main__":
    main()

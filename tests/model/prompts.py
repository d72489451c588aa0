"""Prompts to compare Crescent with the reference: raw and chat, short and long."""

from __future__ import annotations

import random
from typing import Any

from shared.model.tokenizer import Tokenizer

RAW_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "Once upon a time, in a village by the sea,",
    "1, 2, 3, 4, 5,",
    "Q: What is 12 times 7?\nA:",
    "Les élèves ont étudié la géographie de l'Europe et",
    "<html>\n  <head>\n    <title>",
    "The three laws of thermodynamics are",
    "東京は日本の首都で、",
    "SELECT name, COUNT(*) FROM orders",
]

CHAT_PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    [{"role": "user", "content": "Write a short poem about the sea."}],
    [{"role": "user", "content": "Explain recursion to a ten-year-old."}],
    [{"role": "user", "content": "List three fruits that are red."}],
    [
        {"role": "system", "content": "You are a terse assistant who answers in French."},
        {"role": "user", "content": "How many days are in a week?"},
    ],
    [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Nice to meet you, Ada! How can I help?"},
        {"role": "user", "content": "What is my name?"},
    ],
    [{"role": "user", "content": "Write a haiku about autumn leaves 🍂."}],
    [{"role": "user", "content": "Give me a Python one-liner that reverses a string."}],
]

_TOWNS = ["Arden", "Bellmoor", "Corrin", "Dunmere", "Elsford", "Fallow", "Greystone", "Harrow"]
_GOODS = ["wool", "barley", "salt", "copper", "timber", "cider", "linen", "honey"]
_EVENTS = ["a flood", "a fair", "a drought", "a new bridge", "a fire", "a census", "a strike"]


def long_document(seed: int, min_tokens: int, tokenizer: Tokenizer) -> str:
    """A chronicle of made-up towns, deterministic for a seed, at least ``min_tokens`` long."""
    rng = random.Random(seed)
    lines: list[str] = []
    year = 1700 + seed
    while True:
        for _ in range(20):
            year += rng.randint(1, 3)
            town, good, event = rng.choice(_TOWNS), rng.choice(_GOODS), rng.choice(_EVENTS)
            lines.append(
                f"In {year}, {town} traded {rng.randint(10, 990)} loads of {good}; "
                f"the council noted {event} and set the tax at {rng.randint(2, 19)} pence."
            )
        text = "\n".join(lines)
        if len(tokenizer.encode(text)) >= min_tokens:
            return text


def long_chat(seed: int, min_tokens: int, tokenizer: Tokenizer) -> list[dict[str, Any]]:
    doc = long_document(seed, min_tokens, tokenizer)
    question = "Which town is mentioned most often above, and what did it trade?"
    return [{"role": "user", "content": f"{doc}\n\n{question}"}]

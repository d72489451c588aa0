"""The OpenAI-compatible front door: HTTP in, GenerateRequests on the bus, tokens back out."""

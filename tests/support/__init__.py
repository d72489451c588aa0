"""Helpers shared by test packages: a real NATS server, a fake engine on the bus, a served
gateway."""

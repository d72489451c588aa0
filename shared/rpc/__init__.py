"""The cachemeta gRPC API: the .proto, its generated stubs, plain value types and the client."""

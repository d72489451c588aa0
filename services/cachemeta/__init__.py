"""cachemeta: the global catalogue of KV blocks and their replicas, served over gRPC."""

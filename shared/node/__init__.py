"""What prefill and decode nodes share: the engine host, the table of the requests a node
serves and the leases it holds for others, the block puller, pins, heartbeats and the node's
side of the catalogue."""

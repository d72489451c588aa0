"""What prefill and decode nodes share: the engine host, the ledger of what a node holds for
whom, the block puller, pins, heartbeats and the node's side of the catalogue."""

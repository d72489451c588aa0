"""tierd: one per host, keeps KV blocks below DRAM, in NVMe files and in S3."""

"""Process and machine: which install extra an adapter needs, Ray token look-up, the allocator, per-machine measurements. Standard library and torch only."""

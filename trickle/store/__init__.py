"""The Redis plane: the job store, leases, the Lua scripts and the connections that carry them."""

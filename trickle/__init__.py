"""Trickle's job contract: what the web tier and the worker share.

Jobs, events, the Redis key schema, the store and its Lua, leases, queue publishing, config and
tenants. Nothing here imports Flask or CTranslate2, so both processes can load it.
"""

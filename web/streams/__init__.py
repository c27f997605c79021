"""A job's tokens as they are made: the SSE and WebSocket routes, the follower that reads each
token once in order, the pub/sub hub, stream tokens and stream holds."""

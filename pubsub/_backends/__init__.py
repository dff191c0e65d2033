"""The backends of the pub/sub layer: ``memory`` (one process) and ``redis`` (Redis Streams)."""

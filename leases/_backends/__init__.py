"""The backends of the lease layer: ``memory`` (one process) and ``redis``."""

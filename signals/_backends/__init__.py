"""The backends of the signal layer, one folder each: ``memory`` and ``redis``."""

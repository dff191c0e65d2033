"""The in-memory signal store (one process).

``store`` (inbox, receipts, fused calls), ``output`` (streams) and ``presence`` (pending index,
registry, notices).
"""

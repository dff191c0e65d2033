"""Benchmark scripts (a package only so that mypy names them ``bench.*``, not ``leases``)."""

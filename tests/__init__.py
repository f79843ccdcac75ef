"""The test suite as a package: its helpers import as `tests.helpers.*` from the repository root,
the same name for the tests, the benchmarks (`python -m benchmarks.relay`) and mypy."""

"""Test-only helpers shared by the test modules (importable as ``support`` from tests/)."""

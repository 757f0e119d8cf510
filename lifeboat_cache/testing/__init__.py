"""Test helpers shipped with the package: the tier conformance suite and fault injection."""

"""Test kit shipped with the package for tier implementers: the conformance suite (`tiers`), the
reference memory tier (`memory`) and fault injection (`faults`)."""

"""Test helpers shared across suites: local stand-ins for the outside world."""

"""STORE: what this node keeps on disk: models (import, pull, remove), their settings, and the engines (install,
build, verify, activate)."""

"""Blazar's own engine children: small servers a supervisor starts as separate processes (`python -m
blazar.children.<name>`) on loopback with a per-child key, for engines that have no server of their own that speaks
OpenAI's API. They import nothing of Blazar's layers (the import-linter keeps it so) and nothing of Blazar imports
them: the only contract is the command line and the HTTP API."""

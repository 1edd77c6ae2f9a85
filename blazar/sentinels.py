"""Sentinels shared across layers: low enough that dialects, handlers and api can all import them.

`UNSET` stands for "the caller gave no keep_alive", distinct from None (which means: keep loaded forever).
"""

from __future__ import annotations

from typing import Any

UNSET: Any = object()  # keep_alive not given: the setting for a new instance, unchanged for a loaded one

"""Blazar: the control plane for local AI inference, built on one append-only event log."""

__version__ = "0.1.0"

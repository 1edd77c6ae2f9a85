"""Inference engines Blazar drives as child processes: probing a binary, building its argv (llama_server.py)."""

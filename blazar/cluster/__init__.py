"""CLUSTER: other daemons: nodes sharing one PostgreSQL log, and remote OpenAI-compatible upstreams."""

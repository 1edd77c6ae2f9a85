"""SERVING: the request pipeline, from a parsed request to its one terminal event (gateway, admission, limits,
single-flight, fan-out, relay, tenancy). It asks `instances` for an engine and records what it decided."""

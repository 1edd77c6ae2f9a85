"""The OpenAI Realtime API's text sessions (blazar/api/realtime.py serves them over a WebSocket): the protocol's
events (`events.py`) and one connection's session (`session.py`), which asks a chat through a `ChatPort`."""

"""The HTTP side of the daemon: one falcon ASGI app (assembled in app.py) served by granian in blazar/daemon.py."""

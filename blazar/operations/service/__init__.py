"""`blazar service install|uninstall|status`: run the daemon as a systemd unit (a user unit by default) or, on macOS,
a launchd agent. target.py says what the service runs (this install, this home); systemd.py and launchd.py write
and read the files; manage.py puts them in place and drives systemctl through its port (blazar/adapters/systemctl.py).

Nothing here is recorded in the log: the unit file outside the home is the state (doctor reads it), and an event
naming it could never be acted on (the log is not trusted with paths outside the home)."""

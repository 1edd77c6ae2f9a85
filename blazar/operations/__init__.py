"""OPERATIONS: plain commands on the home and the log: snapshot and restore, doctor, moving the log, settings,
keys and `launch`."""

"""`blazar doctor`: checks of the engine, the model store, the log and the machine, each ok, warn or fail with what
it saw and the command that fixes it (checks.py runs them in order); and `--fix`, the repairs a check proved safe,
recorded as events (fix.py). The CLI opens the log between the two halves of the checks."""

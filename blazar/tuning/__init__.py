"""MEASURED, NOT GUESSED: benchmarks of a model through a private engine child (`blazar bench`), the search for the
posture that serves it fastest on this machine and engine build (`blazar tune`), and the engine gate that measures a
new build against the active one. Every measurement is a `bench.recorded` event (blazar/events/tuning.py)."""

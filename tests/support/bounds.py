"""How long a test waits for something that should take no time at all (a step of an in-process pipeline, a fake
child's answer) before it calls it a hang. Generous on purpose: it bounds a wait, it never measures one, so a
machine under a load of 4 (scripts/flake-hunt) must never reach it; timings belong in bench/."""

HANG_S = 60.0

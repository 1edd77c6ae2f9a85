"""WHAT WE DECIDE AND DO: command handlers validate against projections, act, and record what they did."""

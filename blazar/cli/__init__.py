"""The `blazar` command line: parse, call handlers or queries, render with rich or as JSON."""

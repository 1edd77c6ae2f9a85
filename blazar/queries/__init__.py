"""The read side: answers for the CLI and the API from projections or the log; never writes."""

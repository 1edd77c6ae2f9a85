"""Event schemas frozen by golden files: a representative payload and the JSON schema of every event type and version
in the event types (tests/fixtures/events/<type>.v<N>.json), and the event table of docs/3.DATA_MODEL.md, both generated
from the event types by `scripts/event-goldens --write` and checked by tests/unit/events/test_event_goldens.py.

samples.py builds the payloads, schema.py normalizes and compares schemas, files.py reads, writes and checks the
goldens, table.py renders the doc's table, __main__.py is the script.
"""

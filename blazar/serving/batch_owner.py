"""Whose a batch is: the key that made it, as the keys projection says it is now (its scope and limits apply to every
line, a key revoked or expired since refuses the line, its storage quota bounds the batch's results), or the
machine's owner (""). What a failed line may tell its owner is decided here too: an error file is the key's to
download. The batch runner (blazar/serving/batches.py) asks it afresh each time, so a key changed meanwhile counts.
"""

from __future__ import annotations

import logging

from blazar.context import Blazar
from blazar.errors import BlazarError, Refused
from blazar.projections.batches import BatchesState
from blazar.projections.keys import ApiKey
from blazar.projections.keys import key as key_named
from blazar.redact import machine_roots, told
from blazar.serving.principal import Principal
from blazar.serving.storage import Ledger, Storage, storage

log = logging.getLogger("blazar.batches")


class BatchOwner:
    def __init__(self, app: Blazar, owner: str) -> None:
        self.app = app
        self.owner = owner  # "key:<name>", or "" for the machine's owner

    def _key(self) -> ApiKey | None:
        return key_named(self.app.runner.state("keys"), self.owner.removeprefix("key:")) if self.owner else None

    def principal(self) -> Principal | None:
        """The key that made the batch, as it is now; None for the machine's owner. A key revoked or expired since
        refuses the line."""
        if not self.owner:
            return None
        name = self.owner.removeprefix("key:")
        k = self._key()
        now = self.app.clock.now()
        if k is None or k.revoked or (k.expires_ts is not None and k.expires_ts <= now):
            raise Refused(f"the key {name!r} that made this batch is revoked or expired", reason="key_revoked",
                          http_status=401, error_type="authentication_error")
        return Principal(actor=self.owner, admin=k.admin, key=k)

    def told(self, exc: BaseException) -> str:
        """`exc` in the words the owner may read: the whole message for the machine's owner or an admin key,
        blazar/redact.py's public words for any other key (the whole one then goes to the daemon log; the line's
        trace in the log has it too)."""
        k = self._key()
        detail = not self.owner or (k is not None and k.admin)
        paths = self.app.paths
        words = told(exc, detail=detail, roots=machine_roots(paths.data_dir, paths.config_dir))
        if not detail and isinstance(exc, BlazarError) and words != exc.message:
            log.warning("a batch line of %s failed: %s", self.owner, exc.message)
        return words

    def storage(self, state: BatchesState, held: Ledger) -> Storage:
        """What the owner holds (recorded, and on its way) against its storage quota, as its key is now."""
        return storage(state, held, self.owner, self._key(), self.app.settings())

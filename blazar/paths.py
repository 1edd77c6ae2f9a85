"""Where Blazar keeps its files: config under XDG_CONFIG_HOME, data under XDG_DATA_HOME.

`BLAZAR_HOME` overrides both (tests and portable installs use it): config and data then live side by side.
Only `bootstrap` reads the environment; everything else receives a `Paths`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Paths:
    config_dir: Path
    data_dir: Path

    @property
    def config_file(self) -> Path:
        return self.config_dir / "config.toml"

    @property
    def db(self) -> Path:
        return self.data_dir / "blazar.db"

    @property
    def models(self) -> Path:
        return self.data_dir / "models"

    @property
    def engines(self) -> Path:
        return self.data_dir / "engines"

    @property
    def run(self) -> Path:
        return self.data_dir / "run"

    @property
    def log(self) -> Path:
        return self.data_dir / "log"

    @property
    def archive(self) -> Path:
        """Archive segments (unless `archive_dir` says elsewhere: `blazar.logdb.archive_location`)."""
        return self.data_dir / "archive"

    @property
    def snapshots(self) -> Path:
        return self.data_dir / "snapshots"

    @property
    def daemon_lock(self) -> Path:
        return self.run / "daemon.lock"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Paths:
        home = env.get("BLAZAR_HOME")
        if home:
            root = Path(home).expanduser().absolute()
            return cls(config_dir=root, data_dir=root)
        user_home = Path(env.get("HOME") or Path.home())
        config_base = Path(env.get("XDG_CONFIG_HOME") or user_home / ".config")
        data_base = Path(env.get("XDG_DATA_HOME") or user_home / ".local" / "share")
        return cls(config_dir=config_base / "blazar", data_dir=data_base / "blazar")

    def ensure(self) -> None:
        """Create the directories Blazar writes into (idempotent), each 0700: the home holds the log (prompts'
        metadata, key hashes), engine keys and slot dumps. A home dir of ours with a looser mode is tightened."""
        for d in (self.config_dir, self.data_dir, self.models, self.engines, self.run, self.log):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for d in {self.config_dir, self.data_dir}:
            st = d.stat()
            if st.st_uid == os.getuid() and st.st_mode & 0o077:
                d.chmod(0o700)

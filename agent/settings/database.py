"""Where the service keeps its data: the data directory (SQLite files, logs, secrets) and its two databases."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from pydantic import Field

from agent.settings.part import MIN_SECRET_BYTES, Part


class UnsafeDataDirectory(Exception):
    """The data directory cannot be made this user's alone."""


class MissingSecret(Exception):
    """A secret that must already exist (it is never generated where it is only checked against)."""


class DatabaseSettings(Part):
    """The data directory and the databases."""

    data_dir: Path = Field(default=Path(".refund-agent"), alias="refund_agent_data_dir")
    """Where the embedded default keeps its SQLite files, logs and generated secrets: this user's alone (made mode
    0700, and its files 0600, at every start)."""
    dbos_system_database_url: str | None = None
    """DBOS system database (checkpoints). Defaults to SQLite in the data directory."""
    database_url: str | None = None
    """Application database (orders, refunds, audit log). Defaults to SQLite in the data directory."""

    @property
    def system_database_url(self) -> str:
        return self.dbos_system_database_url or self.sqlite_url("dbos_system.sqlite")

    @property
    def app_database_url(self) -> str:
        return self.database_url or self.sqlite_url("refund_agent.sqlite")

    @property
    def sandbox_database_url(self) -> str:
        return self.sqlite_url("payments_sandbox.sqlite")

    @property
    def embedded(self) -> bool:
        return self.app_database_url.startswith("sqlite")

    def sqlite_url(self, name: str) -> str:
        return f"sqlite:///{(self.private_dir() / name).resolve()}"

    def file(self, name: str) -> Path:
        """A file of this host's in the data directory."""
        return self.data_dir.resolve() / name

    def generated_secret(self, name: str, *, generate: bool = True) -> str:
        """A random secret kept (mode 0600) in the data directory: the embedded default's convenience."""
        path = self.data_dir / name
        if not path.exists():
            if not generate:
                raise MissingSecret(f"no {name} in {self.data_dir.resolve()}")
            self.private_dir()
            # Written whole under another name, then linked: a process starting at the same moment sees no file
            # or the whole secret, never an empty one, and a link fails if another process linked its own first.
            staged = path.with_name(f".{name}.{os.getpid()}.{secrets.token_hex(4)}")
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(MIN_SECRET_BYTES))
            try:
                os.link(staged, path)
            except FileExistsError:
                pass  # another process made it first: its secret is the one
            finally:
                staged.unlink()
        secret = path.read_text().strip()
        if len(secret.encode()) < MIN_SECRET_BYTES:
            raise ValueError(
                f"{path.resolve()} holds a secret shorter than {MIN_SECRET_BYTES} bytes: remove the file to have a "
                "new one generated"
            )
        return secret

    def private_dir(self) -> Path:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.data_dir

    def secure_data_dir(self) -> None:
        """Make an existing data directory this user's alone: the directory 0700, its files 0600.

        An earlier release left them 0755 and 0644 (another local user could read the databases, approval links
        included). Only group and other permissions are taken away, so a file keeps its owner's execute bit, and
        a shared directory such as /tmp (sticky bit) is refused rather than closed to everyone else.
        """
        directory = self.data_dir
        if not directory.is_dir():
            return
        mode = directory.stat().st_mode
        if mode & stat.S_ISVTX:
            raise UnsafeDataDirectory(
                f"{directory.resolve()} is a shared directory (sticky bit); choose one of its own for "
                "REFUND_AGENT_DATA_DIR"
            )
        try:
            _deny_others(directory, mode)
            for entry in directory.iterdir():
                info = entry.lstat()
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                    _deny_others(entry, info.st_mode)
        except PermissionError as error:
            raise UnsafeDataDirectory(
                f"cannot make {directory.resolve()} this user's alone ({error.strerror}); choose a directory this "
                "user owns for REFUND_AGENT_DATA_DIR"
            ) from error


def _deny_others(path: Path, mode: int) -> None:
    if mode & 0o077:
        path.chmod(stat.S_IMODE(mode) & ~0o077)

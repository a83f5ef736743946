"""A real SMTP server on loopback (aiosmtpd) that keeps what it accepted and refuses on demand."""

from __future__ import annotations

import ipaddress
import ssl
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email import message_from_bytes
from pathlib import Path
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from agent.ops.processes import free_port

USERNAME = "refund-mailer"
PASSWORD = "smtp-password-7f3a9c2e5b1d4a86"  # what the logs must never show


@dataclass(frozen=True)
class Received:
    message_id: str
    to: tuple[str, ...]
    subject: str
    body: str


class _Handler:
    def __init__(self, server: MailServer) -> None:
        self.server = server

    async def handle_RCPT(self, server: Any, session: Any, envelope: Any, address: str, options: list[str]) -> str:
        if address.startswith("refused@"):
            return "550 5.1.1 no such mailbox"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self.server.lock:
            if self.server.refuse_next > 0:
                self.server.refuse_next -= 1
                self.server.refused += 1
                return "451 4.3.0 try again later"
            parsed = message_from_bytes(envelope.content)
            body = parsed.get_payload(decode=True)
            self.server.received.append(
                Received(
                    message_id=str(parsed["Message-ID"]),
                    to=tuple(envelope.rcpt_tos),
                    subject=str(parsed["Subject"]),
                    body=body.decode() if isinstance(body, bytes) else str(body),
                )
            )
        return "250 OK"


def _authenticator(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and (auth_data.login, auth_data.password) == (
        USERNAME.encode(),
        PASSWORD.encode(),
    )
    return AuthResult(success=ok, handled=False)


class MailServer:
    """aiosmtpd in its own thread: ``refuse_next`` DATA commands get a 451; a ``refused@`` recipient gets a 550;
    a login is accepted only as ``USERNAME``/``PASSWORD`` (plain text allowed: it is loopback)."""

    def __init__(self, **tls: Any) -> None:
        self.lock = threading.Lock()
        self.received: list[Received] = []
        self.refuse_next = 0
        self.refused = 0
        self.port = free_port()
        self.controller = Controller(
            _Handler(self),
            hostname="127.0.0.1",
            port=self.port,
            authenticator=_authenticator,
            auth_require_tls=False,
            **tls,
        )
        self.controller.start()

    def reset(self) -> None:
        with self.lock:
            self.received.clear()
            self.refuse_next = self.refused = 0

    def messages(self) -> list[Received]:
        with self.lock:
            return list(self.received)

    def stop(self) -> None:
        self.controller.stop()


def self_signed_loopback_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA (cert file, key file): a client that trusts it, e.g. through
    ``SSL_CERT_FILE``, verifies the server as a real one."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_file, key_file


class TlsMailServer(MailServer):
    """The same server behind TLS: ``starttls`` (it refuses mail before STARTTLS) or ``ssl`` (TLS from the start)."""

    def __init__(self, mode: str, cert_file: Path, key_file: Path) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_file, key_file)
        tls = {"tls_context": context, "require_starttls": True} if mode == "starttls" else {"ssl_context": context}
        super().__init__(**tls)

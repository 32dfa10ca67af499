"""A certificate authority of the test process's own, so a test endpoint can speak TLS like AWS's.

The job reaches AWS over https; a test endpoint on plain http would make `aws:SecureTransport`
untestable. The fault proxy serves https with a certificate for 127.0.0.1 signed here, and a job
trusts it through AWS_CA_BUNDLE, the SDK's own setting: no code path exists only for tests.
"""

from __future__ import annotations

import atexit
import datetime
import ipaddress
import shutil
import ssl
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


@dataclass(frozen=True)
class LocalAuthority:
    ca_file: Path  # what a client trusts (AWS_CA_BUNDLE)
    certificate_file: Path  # the server's chain for 127.0.0.1
    key_file: Path

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificate_file, self.key_file)
        return context


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


@cache
def authority() -> LocalAuthority:
    """One authority per process, its files removed when the process exits."""
    directory = Path(tempfile.mkdtemp(prefix="beacon-tls-"))
    atexit.register(shutil.rmtree, directory, True)
    now = datetime.datetime.now(datetime.UTC)
    since, until = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .not_valid_before(since)
        .not_valid_after(until)
        .subject_name(_name("beacon test authority"))
        .issuer_name(_name("beacon test authority"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign, cRLSign
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    server = (
        x509.CertificateBuilder()
        .not_valid_before(since)
        .not_valid_after(until)
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(LOOPBACK)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    found = LocalAuthority(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    found.ca_file.write_bytes(ca.public_bytes(pem))
    found.certificate_file.write_bytes(server.public_bytes(pem) + ca.public_bytes(pem))
    found.key_file.write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return found

"""The push's TLS material: checked when the config loads, fingerprinted for reloads, and the
system's trust store as gRPC needs it (one PEM bundle).  Standard library only.

* ``check_ca`` / ``check_pair``: the files OpenSSL will be given, loaded as OpenSSL will load
  them, so a CA file that holds no certificate, an encrypted client key (the push has no way to
  ask for its passphrase) or a key that is not the certificate's fails the config load, naming
  the file, instead of every push.
* ``fingerprint``: a digest of the files' contents.  gRPC reads them into memory once, when its
  exporter is made, so a reload after a certificate rotation at the same paths must see a change
  (``OtlpConfig.identity``) and replace the pusher.
* ``system_store``: the system's CA file or directory as OpenSSL finds them (what OTLP/HTTP
  verifies against), or an error naming both when there is none.
* ``system_roots``: where OpenSSL finds the system's CAs in a directory (``openssl_capath``) and
  no bundle file, the directory's certificates (the hashed names OpenSSL looks up, bounded) as
  one bundle; gRPC would otherwise fall back to its own bundled roots.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import ssl
from collections.abc import Iterable, Iterator
from pathlib import Path

from .. import safefile

MAX_FILE_BYTES = 4 * 1024 * 1024     # one TLS file (a CA bundle is ~200 KiB)
MAX_DIR_ENTRIES = 4096               # certificates read from a CA directory
MAX_BUNDLE_BYTES = 16 * 1024 * 1024  # all of them together
_HASHED = re.compile(r"\A[0-9a-f]{8}\.[0-9]+\Z")  # c_rehash / openssl rehash names (not .r0 CRLs)
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n.+?\r?\n-----END CERTIFICATE-----", re.S)


class _Encrypted(Exception):
    """Raised by the password callback: OpenSSL asked for a passphrase."""


def _no_passphrase() -> bytes:
    raise _Encrypted


def read_bounded(path: Path, limit: int = MAX_FILE_BYTES) -> bytes:
    """A regular file only, never blocking (a FIFO in its place), at most ``limit`` bytes."""
    try:
        return safefile.read_named(path, limit)
    except safefile.TooLarge:
        raise ValueError(f"{path}: larger than {limit} bytes") from None


@contextlib.contextmanager
def memfiles(*contents: bytes) -> Iterator[list[str]]:
    """Paths (``/proc/self/fd/N`` of anonymous memory files) holding ``contents``, for an API that
    takes only paths (OpenSSL's, requests' ``verify``/``cert``): what is read is what was checked,
    and no FIFO or device swapped in at the configured path is ever opened by them."""
    fds: list[int] = []
    try:
        for i, data in enumerate(contents):
            fd = os.memfd_create(f"ugx-otlp-{i}", os.MFD_CLOEXEC)
            fds.append(fd)
            os.write(fd, data)
        yield [f"/proc/self/fd/{fd}" for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)


def check_ca(path: Path) -> None:
    try:
        ca = read_bounded(path).decode("ascii", "replace")
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"{path}: not a file of PEM CA certificates OpenSSL can load ({exc})") from None


def check_pair(cert: Path, key: Path) -> None:
    """The client certificate and its key, loaded as the push will: an unencrypted key that
    belongs to the certificate."""
    try:
        with memfiles(read_bounded(cert), read_bounded(key)) as (cert_path, key_path):
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert_path, key_path, password=_no_passphrase)
    except _Encrypted:
        raise ValueError(f"{key}: the key is encrypted; the push cannot ask for a passphrase: "
                         "give it unencrypted (mode 0600, readable by the exporter only)") from None
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise ValueError(f"{key}: not the key of cert_file {cert}") from None
        raise ValueError(f"{cert} with {key}: OpenSSL cannot load them as a certificate and its key "
                         f"({exc})") from None
    except OSError as exc:
        raise ValueError(f"{cert} with {key}: {exc}") from None


def fingerprint(paths: Iterable[Path | None]) -> str:
    """A digest of the files' names and contents (bounded reads)."""
    h = hashlib.sha256()
    for path in paths:
        if path is None:
            h.update(b"\0-\0")
            continue
        data = read_bounded(path)
        h.update(b"\0%d:%s\0" % (len(str(path)), str(path).encode()))
        h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def system_store() -> str:
    """The system's CA file, or else its CA directory, as OpenSSL was built to find them.  Raises
    OSError naming what was looked at where neither exists (the push then cannot start, counted
    and logged, rather than trusting requests' certifi bundle or gRPC's own roots)."""
    paths = ssl.get_default_verify_paths()
    if paths.openssl_cafile and os.path.isfile(paths.openssl_cafile):
        return paths.openssl_cafile
    if paths.openssl_capath and os.path.isdir(paths.openssl_capath):
        return paths.openssl_capath
    raise OSError(f"no system CA store (neither {paths.openssl_cafile!r} nor {paths.openssl_capath!r} "
                  "exists): set exporters.otlp.tls.ca_file")


def system_roots() -> bytes:
    """The system's CA certificates as one PEM bundle: OpenSSL's CA file, or else the
    certificates of its CA directory (``system_store``)."""
    directory = system_store()
    if os.path.isfile(directory):
        return read_bounded(Path(directory), MAX_BUNDLE_BYTES)
    certs: list[bytes] = []
    seen: set[bytes] = set()
    total = 0
    names = sorted(n for n in os.listdir(directory) if _HASHED.match(n))
    if len(names) > MAX_DIR_ENTRIES:
        raise OSError(f"system CA directory {directory}: more than {MAX_DIR_ENTRIES} certificates: "
                      "set exporters.otlp.tls.ca_file")
    for name in names:
        try:
            data = read_bounded(Path(directory, name), MAX_FILE_BYTES)
        except (OSError, ValueError):
            continue  # a dangling link, an unreadable entry: OpenSSL would skip it too
        for cert in _PEM_CERT.findall(data):
            if cert not in seen:
                seen.add(cert)
                certs.append(cert)
                total += len(cert) + 1
        if total > MAX_BUNDLE_BYTES:
            raise OSError(f"system CA directory {directory}: more than {MAX_BUNDLE_BYTES} bytes of "
                          "certificates: set exporters.otlp.tls.ca_file")
    if not certs:
        raise OSError(f"system CA directory {directory} holds no PEM certificate under a hashed name "
                      "(openssl rehash): set exporters.otlp.tls.ca_file")
    return b"\n".join(certs) + b"\n"

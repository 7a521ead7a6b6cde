"""The Java client's trust and key stores, made into what librdkafka reads.

librdkafka reads trusted certificates as PEM (``ssl.ca.location``) and a client key as a PKCS12 file
(``ssl.keystore.location``) or PEM; the Java client reads JKS and PKCS12 stores (and PEM). So:

- a JKS or PKCS12 **truststore** becomes a PEM file of its certificates: PKCS12 read with the
  ``cryptography`` package, JKS (and JCEKS) listed by Java's ``keytool -list -rfc``;
- a JKS **keystore** becomes a PKCS12 file by ``keytool -importkeystore``, with the same password; a
  PKCS12 keystore is read by librdkafka as it is.

What is made goes to :func:`private_dir` (mode 0700, this user's, under the cache directory of
:mod:`controlmsg.paths`), each file mode 0600 and named by a digest of the store's bytes and password,
so that a store is converted once per machine and a changed store (or password) gets a new file. A
password reaches ``keytool`` through its environment (``-storepass:env``), never its command line, where
another user could read it. A store's format is told by its first bytes, not by the ``*.type`` setting:
Java's JKS keystore type reads PKCS12 files too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from enum import Enum
from pathlib import Path
from typing import Final

from controlmsg.errors import ConfigError
from controlmsg.paths import cache_dir

__all__ = ["StoreFormat", "key_store_pkcs12", "private_dir", "store_format", "trust_store_pem"]

_JKS_MAGIC: Final = b"\xfe\xed\xfe\xed"
_JCEKS_MAGIC: Final = b"\xce\xce\xce\xce"
_PEM_CERT: Final = b"-----BEGIN CERTIFICATE-----"


class StoreFormat(Enum):
    """A store file's format, as its first bytes tell it."""

    JKS = "JKS"
    JCEKS = "JCEKS"
    PKCS12 = "PKCS12"
    PEM = "PEM"


def store_format(data: bytes) -> StoreFormat | None:
    """The format of a store file's bytes ``data``, or ``None`` when it is none of :class:`StoreFormat`."""
    if data.startswith(_JKS_MAGIC):
        return StoreFormat.JKS
    if data.startswith(_JCEKS_MAGIC):
        return StoreFormat.JCEKS
    if data.lstrip().startswith(b"-----BEGIN"):
        return StoreFormat.PEM
    if data[:1] == b"\x30":  # a DER SEQUENCE: PKCS#12's PFX
        return StoreFormat.PKCS12
    return None


def private_dir() -> Path:
    """``<cache>/kafka-stores``, made if missing; mode 0700 and owned by this user, else
    :class:`ConfigError` (converted stores may hold a private key: nobody else may list or read them)."""
    path = cache_dir() / "kafka-stores"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(f"{path} must be a directory of this user's: converted Kafka trust and key stores go "
                          "there; remove it or set CONTROLMSG_CACHE_DIR")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)
    return path


def _read(path: str, setting: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {setting} {path!r}: {exc.strerror or exc}") from None


def _target(kind: str, data: bytes, *secrets: str | None, suffix: str) -> Path:
    digest = hashlib.sha256(kind.encode())
    for part in (data, *(s.encode() if s is not None else b"\x00none" for s in secrets)):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return private_dir() / f"{kind}-{digest.hexdigest()[:32]}{suffix}"


def _write_private(target: Path, data: bytes) -> None:
    """``data`` into ``target`` (mode 0600), atomically: another process converting the same store at the
    same time writes the same bytes."""
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _keytool() -> str:
    home = os.environ.get("JAVA_HOME", "").strip()
    for candidate in ([str(Path(home) / "bin" / "keytool")] if home else []) + [shutil.which("keytool") or ""]:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError("a JKS store needs Java's keytool to be read (none in $JAVA_HOME/bin or on PATH): install "
                      "a JDK, or convert the store once (keytool -exportcert -rfc for a truststore, keytool "
                      "-importkeystore -deststoretype PKCS12 for a keystore) and give librdkafka's settings")


def _run_keytool(args: list[str], secrets: dict[str, str], what: str) -> str:
    env = {**os.environ, **secrets}
    try:
        proc = subprocess.run([_keytool(), *args], env=env, input="\n", capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"{what}: keytool failed: {exc}") from None
    if proc.returncode != 0:
        said = " ".join((proc.stdout + proc.stderr).split())
        for value in secrets.values():
            said = said.replace(value, "***")
        hint = "; check its password" if "password" in said.lower() or "tampered" in said.lower() else ""
        raise ConfigError(f"{what}: keytool: {said[:300]}{hint}")
    return proc.stdout


def trust_store_pem(location: str, password: str | None, declared: str | None = None,
                    setting: str = "ssl.truststore.location") -> Path:
    """A PEM file of the certificates of the truststore at ``location`` (JKS, JCEKS, PKCS12 or PEM;
    ``password`` may be ``None`` for a store without integrity check), for librdkafka's ``ssl.ca.location``.
    A PEM store is returned as it is. ``declared``: the ``ssl.truststore.type`` given, only checked
    against the file (PEM declared for a binary store and the other way round are errors). Blocks while
    keytool runs (a JKS store, the first time on this machine: about a second). Raises
    :class:`ConfigError` naming the setting: an unreadable file, a wrong password, no certificate, no
    keytool for a JKS store."""
    data = _read(location, setting)
    found = store_format(data)
    if found is None:
        raise ConfigError(f"{setting} {location!r} is no JKS, PKCS12 or PEM store")
    if declared and (declared.upper() == "PEM") != (found is StoreFormat.PEM):
        raise ConfigError(f"ssl.truststore.type is {declared}, but {setting} {location!r} is a {found.value} file")
    if found is StoreFormat.PEM:
        if _PEM_CERT not in data:
            raise ConfigError(f"{setting} {location!r} holds no PEM certificate")
        return Path(location)
    target = _target("truststore", data, password, suffix=".pem")
    if target.exists():
        return target
    what = f"{setting} {location!r} ({found.value})"
    if found is StoreFormat.PKCS12:
        pem = _pkcs12_certificates(data, password, what)
    else:
        args = ["-list", "-rfc", "-keystore", location, "-storetype", found.value]
        secrets: dict[str, str] = {}
        if password is not None:
            secrets["CONTROLMSG_KEYTOOL_STOREPASS"] = password
            args += ["-storepass:env", "CONTROLMSG_KEYTOOL_STOREPASS"]
        listing = _run_keytool(args, secrets, what)
        blocks = [block.split("-----END CERTIFICATE-----")[0] for block in listing.split(_PEM_CERT.decode())[1:]]
        pem = "".join(f"{_PEM_CERT.decode()}{block.rstrip()}\n-----END CERTIFICATE-----\n" for block in blocks).encode()
    if not pem:
        raise ConfigError(f"{what} holds no certificate to trust")
    _write_private(target, pem)
    return target


def _pkcs12_certificates(data: bytes, password: str | None, what: str) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

    try:
        store = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError as exc:
        raise ConfigError(f"{what} cannot be read ({exc}); check ssl.truststore.password") from None
    certificates = [*([store.cert] if store.cert is not None else []), *store.additional_certs]
    return b"".join(c.certificate.public_bytes(Encoding.PEM) for c in certificates)


def key_store_pkcs12(location: str, password: str, key_password: str | None,
                     setting: str = "ssl.keystore.location") -> tuple[Path, StoreFormat]:
    """The keystore at ``location`` as a PKCS12 file librdkafka reads with ``ssl.keystore.password``
    ``password``, and the format it was found in: a PKCS12 store as it is, a JKS or JCEKS store converted
    by ``keytool -importkeystore`` (its keys read with ``key_password``, default ``password``) into
    :func:`private_dir`. A PEM keystore is not handled here (see ``ssl.certificate.location``). Blocks
    while keytool runs. Raises :class:`ConfigError` naming the setting."""
    data = _read(location, setting)
    found = store_format(data)
    if found is None or found is StoreFormat.PEM:
        raise ConfigError(f"{setting} {location!r} is no JKS or PKCS12 keystore")
    if found is StoreFormat.PKCS12:
        return Path(location), found
    target = _target("keystore", data, password, key_password, suffix=".p12")
    if target.exists():
        return target, found
    secrets = {"CONTROLMSG_KEYTOOL_SRC": password, "CONTROLMSG_KEYTOOL_KEY": key_password or password}
    what = f"{setting} {location!r} ({found.value})"
    source = ["-srckeystore", location, "-srcstoretype", found.value, "-srcstorepass:env", "CONTROLMSG_KEYTOOL_SRC"]
    work = Path(tempfile.mkdtemp(dir=target.parent, prefix=".keytool-"))
    try:
        made = work / "keystore.p12"
        dest = ["-destkeystore", str(made), "-deststoretype", "PKCS12", "-deststorepass:env", "CONTROLMSG_KEYTOOL_SRC"]
        if key_password is None or key_password == password:
            _run_keytool(["-importkeystore", "-noprompt", *source, *dest], secrets, what)
        else:  # keytool takes a key password per alias only
            listing = _run_keytool(["-list", "-keystore", location, "-storetype", found.value,
                                    "-storepass:env", "CONTROLMSG_KEYTOOL_SRC"], secrets, what)
            aliases = [line.split(",")[0] for line in listing.splitlines() if ", PrivateKeyEntry" in line]
            if not aliases:
                raise ConfigError(f"{what} holds no private key")
            for alias in aliases:
                _run_keytool(["-importkeystore", "-noprompt", *source, *dest, "-srcalias", alias,
                              "-srckeypass:env", "CONTROLMSG_KEYTOOL_KEY", "-destkeypass:env",
                              "CONTROLMSG_KEYTOOL_SRC"], secrets, what)
        made.chmod(0o600)
        os.replace(made, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target, found

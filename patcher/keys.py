"""Ed25519 signing keys for the evidence: generate, load, export the public half.

The private key is a PKCS#8 PEM file with mode 0600, written atomically; a private key that
others can read is refused (as ssh does), and private material is never printed or logged.
A key is named by its keyid: the sha256 of the raw 32-byte public key, in hex.
"""

from __future__ import annotations

import hashlib
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from patcher.errors import SigningKeyError
from patcher.util import write_atomic

_PRIVATE_MARKER = b"PRIVATE KEY-----"


@dataclass(frozen=True)
class KeyInfo:
    path: Path
    keyid: str
    public_pem: str


def keyid_of(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(serialization.Encoding.PEM,
                                   serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")


def generate_key(path: Path, overwrite: bool = False) -> KeyInfo:
    """Create a new private key at ``path`` (mode 0600); refuses to replace one unless asked."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise SigningKeyError(f"a key already exists at {path}",
                              hint="keep it, or pass --force to replace it (evidence signed with it "
                                   "will then only verify against its exported public key)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SigningKeyError(f"cannot create directory {path.parent}: {exc.strerror}") from None
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    # write_atomic's temp file is 0600 from the start: the key is never readable by others.
    try:
        write_atomic(path, pem, mode=0o600)
    except OSError as exc:
        raise SigningKeyError(f"cannot write key into {path.parent}: {exc.strerror}") from None
    public = key.public_key()
    return KeyInfo(path=path, keyid=keyid_of(public), public_pem=public_pem(public))


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise SigningKeyError(f"no {what} at {path}",
                              hint="run `patcher keys generate`, or set key_path / PATCHER_KEY_PATH / --key") from None
    except IsADirectoryError:
        raise SigningKeyError(f"{what} path {path} is a directory") from None
    except OSError as exc:
        raise SigningKeyError(f"cannot read {what} {path}: {exc.strerror}") from None


def load_private_key(path: Path) -> Ed25519PrivateKey:
    path = Path(path)
    data = _read(path, "signing key")
    if _PRIVATE_MARKER not in data:
        raise SigningKeyError(f"{path} holds no private key", hint="signing needs the private key file")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise SigningKeyError(f"signing key {path} is readable by others (mode {mode:04o})",
                              hint=f"chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        # The message of the library may quote the input; say nothing about the content.
        raise SigningKeyError(f"{path} is not an unencrypted PEM private key") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningKeyError(f"{path} is not an Ed25519 key", hint="patcher signs with Ed25519 only")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """A public key from a public PEM, or the public half of a private key file."""
    path = Path(path)
    data = _read(path, "key")
    if _PRIVATE_MARKER in data:
        return load_private_key(path).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise SigningKeyError(f"{path} is not a PEM public key") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningKeyError(f"{path} is not an Ed25519 key", hint="patcher signs with Ed25519 only")
    return key


def export_public(path: Path, out: Path | None = None) -> KeyInfo:
    """The public half of the key at ``path``; written to ``out`` (atomically) when given."""
    public = load_public_key(path)
    info = KeyInfo(path=Path(path), keyid=keyid_of(public), public_pem=public_pem(public))
    if out is not None:
        from patcher.record import write_atomic

        try:
            write_atomic(Path(out), info.public_pem)
        except OSError as exc:
            raise SigningKeyError(f"cannot write public key {out}: {exc.strerror}") from None
    return info

"""Secrets handling: opaque tokens (stored as SHA-256), staff passwords (argon2), contact details
(Fernet, with key rotation), keyed hashes to find a participant by address or return code, and
CSRF tokens bound to a participant's session."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from functools import cache

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from study.settings import get_settings

_passwords = PasswordHasher()
_CODE_ALPHABET = "23456789ABCDEFGHJKMNPQRSTVWXYZ"  # no 0/O, 1/I/L: read aloud and typed by people


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    # Tokens carry 256 bits of randomness, so a fast hash is enough to make a stolen table useless.
    return hashlib.sha256(token.encode()).hexdigest()


def human_code(groups: int = 3, size: int = 4) -> str:
    return "-".join(
        "".join(secrets.choice(_CODE_ALPHABET) for _ in range(size)) for _ in range(groups)
    )


def normalize_code(code: str) -> str:
    return code.strip().upper().replace(" ", "")


def hash_password(password: str) -> str:
    return _passwords.hash(password)


@cache
def _unknown_account_hash() -> str:
    # A hash no password is known for, made with the same parameters as every account's.
    return _passwords.hash(secrets.token_urlsafe(32))


def verify_password(password_hash: str | None, password: str) -> bool:
    """Whether ``password`` matches. With no hash (no such account) the same argon2 verification
    runs against a hash no one knows, so an unknown email takes as long to refuse as a known email
    with a wrong password (no account list by timing)."""
    try:
        return _passwords.verify(password_hash or _unknown_account_hash(), password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


def _fernet() -> MultiFernet:
    return MultiFernet([Fernet(key) for key in get_settings().fernet_keys()])


def encrypt_contact(value: str) -> bytes:
    return _fernet().encrypt(value.encode())


def decrypt_contact(token: bytes) -> str:
    try:
        return _fernet().decrypt(token).decode()
    except InvalidToken:
        raise ValueError("contact details cannot be decrypted with the configured keys") from None


def _lookup_key() -> bytes:
    secret = get_settings().secret_key.get_secret_value().encode()
    return hashlib.sha256(b"afterward-lookup:" + secret).digest()


def email_lookup_hash(address: str) -> str:
    """A keyed hash of a (validated) contact address, so a participant is found by address
    without decrypting everyone's. Case-insensitive: people do not type their address the same
    way twice."""
    return hmac.new(_lookup_key(), b"contact-email:" + address.strip().lower().encode(), hashlib.sha256).hexdigest()


def return_code_hash(code: str) -> str:
    """A keyed hash of a return code, ignoring case, spaces and hyphens (as typed by people)."""
    typed = "".join(code.split()).replace("-", "").upper()
    return hmac.new(_lookup_key(), b"return-code:" + typed.encode(), hashlib.sha256).hexdigest()


def csrf_token_for(session_token: str) -> str:
    secret = get_settings().secret_key.get_secret_value().encode()
    return hmac.new(secret, b"csrf:" + session_token.encode(), hashlib.sha256).hexdigest()


def csrf_token_valid(session_token: str, presented: str) -> bool:
    return hmac.compare_digest(csrf_token_for(session_token), presented)

"""``afterward keys``: encryption keys."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Encryption keys.")


@app.command("generate")
def keys_generate() -> None:
    """Print a new Fernet key for AFTERWARD_CONTACT_ENCRYPTION_KEYS."""
    from cryptography.fernet import Fernet

    typer.echo(Fernet.generate_key().decode())

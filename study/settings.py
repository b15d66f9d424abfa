"""One settings class for the whole platform, read from ``AFTERWARD_*`` environment variables."""

from __future__ import annotations

import base64
import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEV_SECRET = "development-only-secret-do-not-use"  # noqa: S105 - refused outside development
PROJECT_ROOT = Path(__file__).resolve().parent.parent


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AFTERWARD_", env_file=".env", extra="ignore")

    environment: Literal["development", "test", "production"] = "development"
    database_url: str = Field(
        default=f"sqlite:///{PROJECT_ROOT / 'var' / 'afterward.db'}",
        description="SQLAlchemy URL; postgresql+psycopg://user@host/db in production.",
    )
    secret_key: SecretStr = SecretStr(DEV_SECRET)
    contact_encryption_keys: SecretStr | None = Field(
        default=None,
        description="Comma-separated Fernet keys, newest first (older ones still decrypt). "
        "Derived from the secret key in development when unset.",
    )
    base_url: str = "http://127.0.0.1:8000"
    session_ttl_days: int = 90
    staff_token_ttl_days: int = 30
    login_max_failures: int = 5
    login_window_seconds: int = 900

    # LLM gateway (used by chat/): the offline provider needs no network and no key.
    llm_model: str = "offline/afterward"
    llm_timeout_seconds: float = 30.0
    llm_retries: int = Field(default=1, ge=0, le=5)
    llm_fallback_model: str | None = None
    llm_api_base: str | None = Field(
        default=None, description="Base URL for a self-hosted server (Ollama, vLLM); keys come from the provider's own "
        "environment variable, e.g. OPENAI_API_KEY or ANTHROPIC_API_KEY.")
    crisis_classifier_model: str | None = Field(
        default=None, description="Optional LLM crisis classifier run beside the lexicon on every message.")
    offline_llm_delay_ms: float = Field(
        default=0.0, ge=0, description="Simulated generation time of the offline provider (demos, benches).")
    chat_max_message_chars: int = Field(default=4000, ge=100, le=100_000)

    # Follow-up delivery (used by scheduler/). The defaults suit a local test mail server.
    smtp_host: str = "127.0.0.1"
    smtp_port: int = 1025
    smtp_username: str | None = None
    smtp_password: SecretStr | None = None
    smtp_starttls: bool = False
    smtp_timeout_seconds: float = 10.0
    mail_from: str = "Afterward study <afterward@localhost>"
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    scheduler_poll_seconds: float = Field(default=5.0, gt=0)
    scheduler_batch_size: int = Field(default=200, ge=1)
    delivery_lease_seconds: int = Field(default=120, ge=5)
    delivery_max_attempts: int = Field(default=10, ge=1)
    delivery_retry_seconds: int = Field(default=30, ge=1, description="first retry delay; doubles each time")
    channel_alert_after_failures: int = Field(default=3, ge=1)

    @model_validator(mode="after")
    def _refuse_unsafe_defaults(self) -> Settings:
        if self.environment == "production":
            if self.secret_key.get_secret_value() == DEV_SECRET:
                raise ValueError(
                    "AFTERWARD_SECRET_KEY must be set to a long random value in production "
                    "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(48))')"
                )
            if self.contact_encryption_keys is None:
                raise ValueError(
                    "AFTERWARD_CONTACT_ENCRYPTION_KEYS must be set in production "
                    "(generate one with: afterward keys generate)"
                )
        return self

    def fernet_keys(self) -> list[bytes]:
        if self.contact_encryption_keys is not None:
            raw = self.contact_encryption_keys.get_secret_value()
            return [k.strip().encode() for k in raw.split(",") if k.strip()]
        digest = hashlib.sha256(b"afterward-contact:" + self.secret_key.get_secret_value().encode())
        return [base64.urlsafe_b64encode(digest.digest())]


@lru_cache
def get_settings() -> Settings:
    return Settings()

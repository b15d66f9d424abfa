"""One settings class for the whole platform, read from ``AFTERWARD_*`` environment variables."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEV_SECRET = "development-only-secret-do-not-use"  # noqa: S105 - refused outside development
PROJECT_ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("afterward.study.settings")
DASHBOARD_PORT = 8501  # `afterward dashboard`'s port unless --port is given (make run: DASHBOARD_PORT)
# The one settings file: what `make run` and every later command read, from whatever folder and shell
# (the environment's AFTERWARD_* variables win over it); AFTERWARD_SETTINGS_FILE names another.
SETTINGS_FILE = Path(os.environ.get("AFTERWARD_SETTINGS_FILE") or PROJECT_ROOT / ".env")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AFTERWARD_", env_file=SETTINGS_FILE, extra="ignore")

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
    base_url: str = Field(
        default="", description="where participants reach the app (links in emails and printed invites); by "
        "default http://API_HOST:API_PORT, the address `afterward api` serves on")
    api_host: str = Field(default="127.0.0.1", description="host `afterward api` serves on (make run sets it)")
    api_port: int = Field(default=8000, ge=1, le=65535, description="port `afterward api` serves on (make run sets it)")
    dashboard_url: str = Field(
        default="", description="where staff reach the dashboard (the on-call email's link to a safety event); by "
        f"default http://API_HOST:{DASHBOARD_PORT}, where `make run` starts `afterward dashboard`")
    session_ttl_days: int = 90
    sign_in_link_minutes: int = Field(default=30, ge=5, le=1440,
                                      description="how long an emailed sign-in link works (once)")
    staff_token_ttl_days: int = 30
    login_max_failures: int = Field(default=5, ge=1, description="failed sign-ins from one client for one email "
                                    "before each further attempt must wait (the wait doubles per failure)")
    login_window_seconds: int = 900
    login_max_delay_seconds: int = Field(default=300, ge=1, description="longest wait between sign-in attempts")
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default=[], description="addresses of reverse proxies whose X-Forwarded-For is believed (comma-separated "
        "in the environment); from anyone else the header is ignored")
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="largest request body accepted")

    # Database waits: nothing waits forever (PostgreSQL session settings, SQLite busy wait).
    db_lock_timeout_ms: int = Field(default=5_000, ge=1)
    db_statement_timeout_ms: int = Field(default=30_000, ge=1)
    db_idle_in_transaction_timeout_ms: int = Field(default=60_000, ge=1)
    db_pool_timeout_seconds: float = Field(default=10.0, gt=0)

    # The audit chain is keyed (HMAC) with a key kept outside the database, and its head is anchored
    # outside the database too, so someone with database access cannot rewrite or truncate it.
    audit_key: SecretStr | None = Field(
        default=None, description="HMAC key of the audit chain; derived from the secret key in development")
    audit_anchor_path: Path = Field(
        default=PROJECT_ROOT / "var" / "audit-anchors.jsonl",
        description="append-only file of anchored chain heads (put it on storage the database admin cannot write)")
    audit_anchor_webhook_url: str | None = Field(
        default=None, description="also POST each anchor here (e.g. a mail relay to the IRB's mailbox)")
    audit_anchor_interval_minutes: int = Field(default=60, ge=1, description="how often the dispatcher anchors")

    # LLM gateway (used by chat/): the offline provider needs no network and no key.
    llm_model: str = "offline/afterward"
    llm_timeout_seconds: float = 30.0
    llm_retries: int = Field(default=1, ge=0, le=5)
    llm_fallback_model: str | None = None
    llm_api_base: str | None = Field(
        default=None, description="Base URL for a self-hosted server (Ollama, vLLM); keys come from the provider's own "
        "environment variable, e.g. OPENAI_API_KEY or ANTHROPIC_API_KEY.")
    llm_reader_model: str | None = Field(
        default=None, description="Optional LLM reader (chat.llm_reader): reads every participant message against "
        "a versioned rubric, its verdict fused with the local reading.")
    crisis_classifier_model: str | None = Field(
        default=None, description="Deprecated: the former name of llm_reader_model (the LLM crisis classifier grew "
        "into the LLM reader), still read with a warning when llm_reader_model is not given.")
    offline_llm_delay_ms: float = Field(
        default=0.0, ge=0, description="Simulated generation time of the offline provider (demos, benches).")
    chat_max_message_chars: int = Field(default=4000, ge=100, le=100_000)
    eval_log_dir: Path = Field(
        default=PROJECT_ROOT / "var" / "evals" / "inspect",
        description="where evaluation runs write their Inspect logs (a folder per run; `inspect view --log-dir`)")
    # The dashboard fits the report's models again in the background once the stored fit is older
    # than this (analysis.fits); 0: never on its own (fit with `afterward models fit`, e.g. nightly).
    model_fit_max_age_minutes: int = Field(default=60, ge=0)
    allow_offline_model: bool = Field(
        default=False, description="let production run on the offline provider (demos only: its canned replies "
        "would otherwise be recorded as research data)")

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

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _default_urls(self) -> Settings:
        if not self.base_url:
            self.base_url = served_url(self.api_host, self.api_port)
        if not self.dashboard_url:  # make run serves the dashboard on the API's host
            self.dashboard_url = served_url(self.api_host, DASHBOARD_PORT)
        return self

    @model_validator(mode="after")
    def _reader_from_deprecated_name(self) -> Settings:
        old = self.crisis_classifier_model
        if not old:
            return self
        if "llm_reader_model" in self.model_fields_set:  # the new name, even when given as none, wins
            if self.llm_reader_model and self.llm_reader_model != old:
                raise ValueError(f"AFTERWARD_LLM_READER_MODEL ({self.llm_reader_model}) and its deprecated name "
                                 f"AFTERWARD_CRISIS_CLASSIFIER_MODEL ({old}) disagree; set only "
                                 "AFTERWARD_LLM_READER_MODEL")
            return self
        log.warning("AFTERWARD_CRISIS_CLASSIFIER_MODEL is deprecated: it is read as AFTERWARD_LLM_READER_MODEL "
                    "(the LLM crisis classifier grew into the LLM reader); rename it")
        self.llm_reader_model = old
        return self

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
            if self.audit_key is None:
                raise ValueError("AFTERWARD_AUDIT_KEY must be set in production, and kept outside the database "
                                 "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(48))')")
            offline = [m for m in (self.llm_model, self.llm_fallback_model, self.llm_reader_model)
                       if m and m.startswith("offline/")]
            if offline and not self.allow_offline_model:
                raise ValueError(
                    f"the offline model ({offline[0]}) gives canned replies and would be recorded as research data; "
                    "set AFTERWARD_LLM_MODEL to a real provider in production, or AFTERWARD_ALLOW_OFFLINE_MODEL=true "
                    "for a demo")
        return self

    def fernet_keys(self) -> list[bytes]:
        if self.contact_encryption_keys is not None:
            raw = self.contact_encryption_keys.get_secret_value()
            return [k.strip().encode() for k in raw.split(",") if k.strip()]
        digest = hashlib.sha256(b"afterward-contact:" + self.secret_key.get_secret_value().encode())
        return [base64.urlsafe_b64encode(digest.digest())]

    def audit_hmac_key(self) -> bytes:
        if self.audit_key is not None:
            return self.audit_key.get_secret_value().encode()
        return hashlib.sha256(b"afterward-audit:" + self.secret_key.get_secret_value().encode()).digest()


def served_url(host: str, port: int) -> str:
    """The address of a server listening on ``host``:``port``, as others would type it: a server on every
    interface (0.0.0.0, ::) is named by this machine's host name."""
    if host in ("", "0.0.0.0", "::"):  # noqa: S104 - naming the wildcard, not binding it
        host = socket.gethostname()
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


@lru_cache
def get_settings() -> Settings:
    return Settings()

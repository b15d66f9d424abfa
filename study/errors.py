"""Domain errors. Each carries a stable ``code`` and a message a person can act on; the API maps
the class to an HTTP status in one place (api/errors.py)."""

from __future__ import annotations


class DomainError(Exception):
    code = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code


class NotFound(DomainError):
    code = "not_found"


class Conflict(DomainError):
    code = "conflict"


class Gone(DomainError):
    code = "gone"


class Forbidden(DomainError):
    code = "forbidden"


class Invalid(DomainError):
    code = "invalid"


class ConsentRequired(Forbidden):
    code = "consent_required"


class TooManyAttempts(DomainError):
    code = "too_many_attempts"

    def __init__(self, message: str, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class Unavailable(DomainError):
    """A dependency (the LLM, a mail server) failed; what the caller sent is kept, retry later."""

    code = "unavailable"

    def __init__(self, message: str, *, code: str | None = None, retry_after_seconds: int = 5) -> None:
        super().__init__(message, code=code)
        self.retry_after_seconds = retry_after_seconds

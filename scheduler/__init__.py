"""Follow-ups: the planner, the dispatcher (its own process, on APScheduler), delivery channels."""

# Importing the package registers the hooks that stop pending work on completion and withdrawal,
# in every process that plans follow-ups (the API, the CLI, the dispatcher).
from scheduler import service as _service  # noqa: F401

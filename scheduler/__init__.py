"""Follow-ups: the planner, the dispatcher (its own process, on APScheduler), delivery channels."""

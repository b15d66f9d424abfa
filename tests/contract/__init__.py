"""Property-based API testing against the running server (run by .ci/run, not collected by pytest)."""

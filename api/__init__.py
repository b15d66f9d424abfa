"""The HTTP edge (FastAPI) and the command line."""

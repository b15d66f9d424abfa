"""Survey instruments (published and custom), validation, scoring and responses."""

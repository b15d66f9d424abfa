"""evaluation: each run records where it came from

``eval_runs.grid_sha256`` is the SHA-256 of the grid file's bytes as the run was started from it
(``None`` for a grid built in code). ``eval_runs.provenance`` holds the code the run was made
with (``evals.provenance``): the project's git commit and whether the working tree was dirty when
git can tell, else the installed ``afterward`` version; the installed versions of the packages
that matter to the harness's numbers; and the SHA-256 of ``requirements/runtime.txt``. Runs before
this revision recorded none of it: both are ``NULL`` for them, shown as "not recorded", never
guessed.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain nullable ADD COLUMNs: no batch copy of the table on SQLite.
    op.add_column("eval_runs", sa.Column("grid_sha256", sa.String(length=64), nullable=True))
    op.add_column("eval_runs", sa.Column("provenance", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("eval_runs", "provenance")
    op.drop_column("eval_runs", "grid_sha256")

"""languages: the participant's language, consent texts per language, instrument translations

``participants.language`` is the language a participant reads the study in; ``consent_versions``
keeps the language of its text and the text and confirmations in each other language the protocol
offers (``translations``), and ``consent_signatures.language`` the language a consent was shown and
signed in (its ``signed_text_sha256`` is of that text); ``survey_responses.language`` is the language
the items were shown in; ``instrument_translations`` holds the study team's translations of an
instrument version. Rows before this revision are English (their language column: 'en', or none
for participants and responses, which read as English).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07 07:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.add_column(sa.Column("language", sa.String(length=16), nullable=True))
    with op.batch_alter_table("consent_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("language", sa.String(length=16), nullable=False, server_default="en"))
        batch_op.add_column(sa.Column("translations", sa.JSON(), nullable=True))
    with op.batch_alter_table("consent_signatures", schema=None) as batch_op:
        batch_op.add_column(sa.Column("language", sa.String(length=16), nullable=False, server_default="en"))
    with op.batch_alter_table("survey_responses", schema=None) as batch_op:
        batch_op.add_column(sa.Column("language", sa.String(length=16), nullable=True))
    op.create_table(
        "instrument_translations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("instrument_id", sa.String(length=64), nullable=False),
        sa.Column("version", sa.String(length=40), nullable=False),
        sa.Column("language", sa.String(length=16), nullable=False),
        sa.Column("definition", sa.JSON(), nullable=False),
        sa.Column("source_yaml", sa.Text(), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instrument_translations")),
        sa.UniqueConstraint("instrument_id", "version", "language",
                            name=op.f("uq_instrument_translations_instrument_id_version_language")),
    )


def downgrade() -> None:
    op.drop_table("instrument_translations")
    with op.batch_alter_table("survey_responses", schema=None) as batch_op:
        batch_op.drop_column("language")
    with op.batch_alter_table("consent_signatures", schema=None) as batch_op:
        batch_op.drop_column("language")
    with op.batch_alter_table("consent_versions", schema=None) as batch_op:
        batch_op.drop_column("translations")
        batch_op.drop_column("language")
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.drop_column("language")

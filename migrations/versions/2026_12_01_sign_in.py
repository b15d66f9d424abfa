"""participants sign in again: by an emailed link or a return code

``participants.contact_email_hmac`` and ``return_code_hmac`` are keyed hashes that find the
participant who asks to sign in again, without decrypting anyone's contact details (indexes, not
table constraints, so SQLite does not copy the ``participants`` table: dropping the old copy would
cascade to every table that references a participant). Addresses already on file get their hash
from ``afterward db upgrade``, which can read the keys; a revision does not.

``sign_in_emails`` queues the links participants ask for, sent by the dispatcher like deliveries;
``used_sign_in_links`` makes each link single-use; ``sign_in_attempts`` is what the sign-in limits
count.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("participants", sa.Column("contact_email_hmac", sa.String(length=64), nullable=True))
    op.add_column("participants", sa.Column("return_code_hmac", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_participants_contact_email_hmac"), "participants", ["contact_email_hmac"],
                    unique=False)
    op.create_index(op.f("ix_participants_return_code_hmac"), "participants", ["return_code_hmac"], unique=True)

    op.create_table(
        "sign_in_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("subject", sa.String(length=64), nullable=True),
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("succeeded", sa.Boolean(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sign_in_attempts")),
    )
    op.create_index(op.f("ix_sign_in_attempts_at"), "sign_in_attempts", ["at"], unique=False)
    op.create_index(op.f("ix_sign_in_attempts_client"), "sign_in_attempts", ["client"], unique=False)
    op.create_index(op.f("ix_sign_in_attempts_subject"), "sign_in_attempts", ["subject"], unique=False)

    op.create_table(
        "sign_in_emails",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_by", sa.String(length=64), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["participant_id"], ["participants.id"],
                                name=op.f("fk_sign_in_emails_participant_id_participants"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sign_in_emails")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_sign_in_emails_idempotency_key")),
    )
    op.create_index(op.f("ix_sign_in_emails_due"), "sign_in_emails", ["status", "next_attempt_at"], unique=False)
    op.create_index(op.f("ix_sign_in_emails_participant_id"), "sign_in_emails", ["participant_id"], unique=False)

    op.create_table(
        "used_sign_in_links",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("nonce", sa.String(length=128), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["participant_id"], ["participants.id"],
                                name=op.f("fk_used_sign_in_links_participant_id_participants"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_used_sign_in_links")),
        sa.UniqueConstraint("nonce", name=op.f("uq_used_sign_in_links_nonce")),
    )
    op.create_index(op.f("ix_used_sign_in_links_participant_id"), "used_sign_in_links", ["participant_id"],
                    unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_used_sign_in_links_participant_id"), table_name="used_sign_in_links")
    op.drop_table("used_sign_in_links")
    op.drop_index(op.f("ix_sign_in_emails_participant_id"), table_name="sign_in_emails")
    op.drop_index(op.f("ix_sign_in_emails_due"), table_name="sign_in_emails")
    op.drop_table("sign_in_emails")
    op.drop_index(op.f("ix_sign_in_attempts_subject"), table_name="sign_in_attempts")
    op.drop_index(op.f("ix_sign_in_attempts_client"), table_name="sign_in_attempts")
    op.drop_index(op.f("ix_sign_in_attempts_at"), table_name="sign_in_attempts")
    op.drop_table("sign_in_attempts")
    op.drop_index(op.f("ix_participants_return_code_hmac"), table_name="participants")
    op.drop_index(op.f("ix_participants_contact_email_hmac"), table_name="participants")
    # In place, also on SQLite (>= 3.35): the columns carry no constraint, their indexes are gone.
    op.drop_column("participants", "return_code_hmac")
    op.drop_column("participants", "contact_email_hmac")

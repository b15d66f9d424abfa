"""Foundation: studies, protocol and consent versions, participants, staff, audit log.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 14:40:31.121507
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor_type", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=320), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=True),
        sa.Column("participant_code", sa.String(length=16), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("entry_hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("seq", name=op.f("pk_audit_log")),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_participant_code"), ["participant_code"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_log_study_id"), ["study_id"], unique=False)

    op.create_table(
        "login_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("client", sa.String(length=64), nullable=False),
        sa.Column("succeeded", sa.Boolean(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_login_attempts")),
    )
    with op.batch_alter_table("login_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_login_attempts_at"), ["at"], unique=False)
        batch_op.create_index(batch_op.f("ix_login_attempts_client"), ["client"], unique=False)
        batch_op.create_index(batch_op.f("ix_login_attempts_email"), ["email"], unique=False)

    op.create_table(
        "staff_accounts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("email", sa.String(length=320), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("password_hash", sa.String(length=200), nullable=False),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_accounts")),
        sa.UniqueConstraint("email", name=op.f("uq_staff_accounts_email")),
    )
    op.create_table(
        "studies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("slug", sa.String(length=64), nullable=False),
        sa.Column("title", sa.String(length=300), nullable=False),
        sa.Column("allocation_seed", sa.String(length=64), nullable=False),
        sa.Column("allocation_count", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_studies")),
        sa.UniqueConstraint("slug", name=op.f("uq_studies_slug")),
    )
    op.create_table(
        "consent_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.String(length=40), nullable=False),
        sa.Column("text_markdown", sa.Text(), nullable=False),
        sa.Column("text_sha256", sa.String(length=64), nullable=False),
        sa.Column("confirmations", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"], ["studies.id"], name=op.f("fk_consent_versions_study_id_studies"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_consent_versions")),
        sa.UniqueConstraint("study_id", "version", name=op.f("uq_consent_versions_study_id_version")),
    )
    op.create_table(
        "invite_codes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("code_sha256", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=True),
        sa.Column("max_uses", sa.Integer(), nullable=False),
        sa.Column("use_count", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("max_uses >= 1", name=op.f("ck_invite_codes_max_uses_positive")),
        sa.CheckConstraint("use_count <= max_uses", name=op.f("ck_invite_codes_use_count_within_cap")),
        sa.ForeignKeyConstraint(
            ["study_id"], ["studies.id"], name=op.f("fk_invite_codes_study_id_studies"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_invite_codes")),
        sa.UniqueConstraint("code_sha256", name=op.f("uq_invite_codes_code_sha256")),
    )
    op.create_table(
        "staff_memberships",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("staff_id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.CheckConstraint("role IN ('admin', 'researcher', 'viewer')", name=op.f("ck_staff_memberships_role_known")),
        sa.ForeignKeyConstraint(
            ["staff_id"],
            ["staff_accounts.id"],
            name=op.f("fk_staff_memberships_staff_id_staff_accounts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["study_id"], ["studies.id"], name=op.f("fk_staff_memberships_study_id_studies"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_memberships")),
        sa.UniqueConstraint("staff_id", "study_id", name=op.f("uq_staff_memberships_staff_id_study_id")),
    )
    op.create_table(
        "staff_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("staff_id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["staff_id"],
            ["staff_accounts.id"],
            name=op.f("fk_staff_tokens_staff_id_staff_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_staff_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_staff_tokens_token_sha256")),
    )
    with op.batch_alter_table("staff_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_staff_tokens_staff_id"), ["staff_id"], unique=False)

    op.create_table(
        "participants",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("code", sa.String(length=16), nullable=False),
        sa.Column("invite_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("timezone", sa.String(length=64), nullable=True),
        sa.Column("contact_email_encrypted", sa.LargeBinary(), nullable=True),
        sa.Column("arm", sa.String(length=64), nullable=True),
        sa.Column("assigned_protocol_version", sa.Integer(), nullable=True),
        sa.Column("allocation_index", sa.Integer(), nullable=True),
        sa.Column("enrolled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("withdrawn_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("withdrawal_level", sa.String(length=16), nullable=True),
        sa.Column("data_deleted_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["invite_id"], ["invite_codes.id"], name=op.f("fk_participants_invite_id_invite_codes")
        ),
        sa.ForeignKeyConstraint(
            ["study_id"], ["studies.id"], name=op.f("fk_participants_study_id_studies"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_participants")),
        sa.UniqueConstraint("code", name=op.f("uq_participants_code")),
    )
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_participants_study_id"), ["study_id"], unique=False)

    op.create_table(
        "protocol_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("study_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("protocol", sa.JSON(), nullable=False),
        sa.Column("source_yaml", sa.Text(), nullable=False),
        sa.Column("source_sha256", sa.String(length=64), nullable=False),
        sa.Column("consent_version_id", sa.Integer(), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["consent_version_id"],
            ["consent_versions.id"],
            name=op.f("fk_protocol_versions_consent_version_id_consent_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["study_id"], ["studies.id"], name=op.f("fk_protocol_versions_study_id_studies"), ondelete="RESTRICT"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_protocol_versions")),
        sa.UniqueConstraint("study_id", "version", name=op.f("uq_protocol_versions_study_id_version")),
    )
    op.create_table(
        "consent_signatures",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("consent_version_id", sa.Integer(), nullable=False),
        sa.Column("signed_text_sha256", sa.String(length=64), nullable=False),
        sa.Column("typed_signature", sa.String(length=200), nullable=False),
        sa.Column("confirmations", sa.JSON(), nullable=False),
        sa.Column("signed_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["consent_version_id"],
            ["consent_versions.id"],
            name=op.f("fk_consent_signatures_consent_version_id_consent_versions"),
        ),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_consent_signatures_participant_id_participants"),
            ondelete="RESTRICT",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_consent_signatures")),
    )
    with op.batch_alter_table("consent_signatures", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_consent_signatures_participant_id"), ["participant_id"], unique=False)

    op.create_table(
        "participant_sessions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("participant_id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["participant_id"],
            ["participants.id"],
            name=op.f("fk_participant_sessions_participant_id_participants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_participant_sessions")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_participant_sessions_token_sha256")),
    )
    with op.batch_alter_table("participant_sessions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_participant_sessions_participant_id"), ["participant_id"], unique=False)

    # The audit log is append-only: refuse UPDATE and DELETE in the database itself.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION 'audit_log is append-only'; END $$"
        )
        op.execute(
            "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log "
            "FOR EACH ROW EXECUTE FUNCTION audit_log_append_only()"
        )
    else:
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_log_no_{event.lower()} BEFORE {event} ON audit_log "
                "BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END"
            )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS audit_log_append_only ON audit_log")
        op.execute("DROP FUNCTION IF EXISTS audit_log_append_only()")
    with op.batch_alter_table("participant_sessions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_participant_sessions_participant_id"))

    op.drop_table("participant_sessions")
    with op.batch_alter_table("consent_signatures", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_consent_signatures_participant_id"))

    op.drop_table("consent_signatures")
    op.drop_table("protocol_versions")
    with op.batch_alter_table("participants", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_participants_study_id"))

    op.drop_table("participants")
    with op.batch_alter_table("staff_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_staff_tokens_staff_id"))

    op.drop_table("staff_tokens")
    op.drop_table("staff_memberships")
    op.drop_table("invite_codes")
    op.drop_table("consent_versions")
    op.drop_table("studies")
    op.drop_table("staff_accounts")
    with op.batch_alter_table("login_attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_login_attempts_email"))
        batch_op.drop_index(batch_op.f("ix_login_attempts_client"))
        batch_op.drop_index(batch_op.f("ix_login_attempts_at"))

    op.drop_table("login_attempts")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_study_id"))
        batch_op.drop_index(batch_op.f("ix_audit_log_participant_code"))

    op.drop_table("audit_log")

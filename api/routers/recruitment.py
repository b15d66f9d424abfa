"""Staff recruitment control: invites and their use, revoking one, and pausing, resuming, closing
or archiving a study. Researchers and admins of the study only; every call is audited."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from api.deps import SessionDep
from api.errors import DocumentedRoute, refusals, refuses
from api.routers.staff import ParticipantLevelAccess, StudyAccess, staff_actor
from scheduler import service as scheduler_service
from study import audit, recruitment
from study import staff as staff_service
from study.errors import Forbidden
from study.recruitment import InviteStatus, StudyAction
from study.schemas import InviteRead, InviteRevoke, StudyClose, StudyStatusRead

staff_router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)
CHANGE = {409: "the study's status does not allow this change, or changed meanwhile "
               "(codes invalid_transition, status_changed)"}
Actor = Annotated[audit.Actor, Depends(staff_actor)]


@refuses({403: "your role in this study cannot change recruitment (code recruitment_forbidden)"})
async def manage_access(access: StudyAccess) -> staff_service.StudyAccess:
    if access.role not in staff_service.MANAGE_ROLES:
        raise Forbidden(f"your role in this study ({access.role}) cannot change recruitment; "
                        "a researcher or admin of the study can", code="recruitment_forbidden")
    return access


ManageAccess = Annotated[staff_service.StudyAccess, Depends(manage_access)]


@staff_router.get("/studies/{slug}/invites")
def list_invites(session: SessionDep, access: ParticipantLevelAccess, actor: Actor,
                 status: InviteStatus | None = None) -> list[InviteRead]:
    """Every invite with its creation time and who used it when (participant codes only; audited)."""
    return [InviteRead.of(listing) for listing in recruitment.list_invites(session, access.study, actor, status)]


@staff_router.post("/studies/{slug}/invites/revoke", responses=refusals({
    404: "the study has no invite with this code or id",
    409: "the invite was already revoked, or the study is archived (codes invite_already_revoked, study_archived)"}))
def revoke_invite(body: InviteRevoke, session: SessionDep, access: ManageAccess, actor: Actor) -> InviteRead:
    """Revoke one invite by its code or id: nobody can enroll with it afterwards (audited)."""
    return InviteRead.of(recruitment.revoke_invite(session, access.study, actor, code=body.code,
                                                   invite_id=body.invite_id))


def _change(session: SessionDep, access: staff_service.StudyAccess, actor: audit.Actor, action: StudyAction,
            stop_followups: bool = False) -> StudyStatusRead:
    change = scheduler_service.change_study_status(session, access.study, action, actor,
                                                   stop_followups=stop_followups)
    study = change.study
    return StudyStatusRead(study=study.slug, status=study.status, status_changed_at=study.status_changed_at,
                           followups_stopped_at=study.followups_stopped_at,
                           followups_cancelled=change.followups_cancelled)


@staff_router.post("/studies/{slug}/pause", responses=refusals(CHANGE))
def pause_study(session: SessionDep, access: ManageAccess, actor: Actor) -> StudyStatusRead:
    """Stop new enrollments for now (an open study); enrolled participants go on."""
    return _change(session, access, actor, StudyAction.PAUSE)


@staff_router.post("/studies/{slug}/resume", responses=refusals(CHANGE))
def resume_study(session: SessionDep, access: ManageAccess, actor: Actor) -> StudyStatusRead:
    """Take new enrollments again (a paused study)."""
    return _change(session, access, actor, StudyAction.RESUME)


@staff_router.post("/studies/{slug}/close", responses=refusals(CHANGE))
def close_study(session: SessionDep, access: ManageAccess, actor: Actor,
                body: StudyClose | None = None) -> StudyStatusRead:
    """End recruitment for good (an open or paused study). Follow-ups of enrolled participants
    continue unless ``stop_followups`` (which also works on a study already closed)."""
    return _change(session, access, actor, StudyAction.CLOSE, stop_followups=body.stop_followups if body else False)


@staff_router.post("/studies/{slug}/archive", responses=refusals({
    409: CHANGE[409] + ", or follow-ups are still to come (code followups_pending)"}))
def archive_study(session: SessionDep, access: ManageAccess, actor: Actor) -> StudyStatusRead:
    """Hide a closed study from the default listings and make it read-only (no follow-ups may be left)."""
    return _change(session, access, actor, StudyAction.ARCHIVE)

"""Participant endpoints: enrollment, consent, profile, withdrawal. Everything is about the caller
("me"); no endpoint takes another participant's id."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.responses import PlainTextResponse

from api.deps import CurrentParticipant, SessionDep, participant_token, set_session_cookie
from api.errors import DocumentedRoute, refusals
from scheduler import service as scheduler_service
from study import audit, i18n, signin
from study import participants as service
from study.i18n import N_
from study.models import ConsentSignature, ConsentVersion, Participant, Study
from study.schemas import (
    ConsentAboutRead,
    ConsentConfirmationRead,
    ConsentRead,
    ConsentSign,
    ConsentStatusRead,
    EnrollmentCreate,
    EnrollmentRead,
    LanguageUpdate,
    ParticipantRead,
    ProfileUpdate,
    SignedConsentRead,
    WithdrawalCreate,
    WithdrawalRead,
)
from study.security import csrf_token_for
from study.studies import protocol_for_consent

router = APIRouter(tags=["participant"], route_class=DocumentedRoute)
Token = Annotated[str, Depends(participant_token)]
WITHDRAWN = "the participant withdrew (code withdrawn)"


def _consent_read(session: SessionDep, consent: ConsentVersion, participant: Participant) -> ConsentRead:
    language = service.consent_language(participant, consent)
    text = consent.text_in(language)
    return ConsentRead(version=consent.version, language=language, languages=consent.languages, text_markdown=text,
                       text_sha256=consent.digest_in(language),
                       confirmations=[ConsentConfirmationRead(**c) for c in consent.confirmations_in(language)],
                       about=ConsentAboutRead.of(protocol_for_consent(session, consent.id), language))


def _participant_read(session: SessionDep, participant: Participant, token: str | None) -> ParticipantRead:
    study = session.get(Study, participant.study_id)
    assert study is not None
    return ParticipantRead(
        participant_code=participant.code, study=study.slug, status=participant.status,
        arm=participant.arm, timezone=participant.timezone, language=participant.language,
        has_contact_email=participant.contact_email_encrypted is not None,
        enrolled_at=participant.enrolled_at, withdrawn_at=participant.withdrawn_at,
        withdrawal_level=participant.withdrawal_level,
        needs_consent=not participant.is_withdrawn and service.consent_status(session, participant).needs_consent,
        csrf_token=csrf_token_for(token) if token else None)


@router.post("/enrollment", status_code=status.HTTP_201_CREATED, responses=refusals({
    403: "the study is not taking new participants now (codes enrollment_paused, enrollment_closed)",
    404: "the invite code is not known",
    409: "the invite has been used as often as it may be (code invite_used), or the panel id already joined "
         "the study (code duplicate_panel_id)",
    410: "the invite was revoked (code invite_revoked) or has expired"}))
def enroll(body: EnrollmentCreate, session: SessionDep, request: Request, response: Response) -> EnrollmentRead:
    """Redeem an invite code. Next: read and sign the consent returned here, in the language of the
    study that the request's Accept-Language prefers (else the study's first)."""
    enrollment = service.enroll(session, body.invite_code, body.panel_id,
                                languages=i18n.primary(request.headers.get("accept-language")))
    set_session_cookie(response, enrollment.token)
    consent = service.consent_status(session, enrollment.participant).current
    return EnrollmentRead(participant_code=enrollment.participant.code, token=enrollment.token,
                          csrf_token=csrf_token_for(enrollment.token),
                          consent=_consent_read(session, consent, enrollment.participant))


@router.get("/me")
def me(session: SessionDep, participant: CurrentParticipant, token: Token) -> ParticipantRead:
    return _participant_read(session, participant, token)


@router.get("/me/consent")
def consent_status(session: SessionDep, participant: CurrentParticipant) -> ConsentStatusRead:
    state = service.consent_status(session, participant)
    return ConsentStatusRead(current=_consent_read(session, state.current, participant),
                             signed_version=state.signed_version,
                             signed_at=state.signed.signed_at if state.signed else None,
                             needs_consent=state.needs_consent)


@router.post("/me/consent", status_code=status.HTTP_201_CREATED, responses=refusals({
    403: WITHDRAWN,
    409: "this consent version is not the one in force: read the current one (GET /me/consent)",
    422: "a required confirmation is not ticked (code confirmation_missing), the signature is empty, or the "
         "consent is not written in the language named (code consent_language)"}))
def sign_consent(body: ConsentSign, session: SessionDep, participant: CurrentParticipant) -> SignedConsentRead:
    """Sign the consent version in force (also how a participant re-consents after a revision)."""
    service.sign_consent(session, participant, version=body.version, confirmations=body.confirmations,
                         typed_signature=body.typed_signature, language=body.language)
    return _signed_copy(session, participant)


def _signed_copy(session: SessionDep, participant: Participant,
                 signed: tuple[ConsentSignature, ConsentVersion] | None = None) -> SignedConsentRead:
    signature, version = signed or service.signed_consent_text(session, participant)
    return SignedConsentRead(
        participant_code=participant.code, version=version.version, language=signature.language,
        about=ConsentAboutRead.of(protocol_for_consent(session, version.id), signature.language),
        text_markdown=version.text_in(signature.language), signed_text_sha256=signature.signed_text_sha256,
        typed_signature=signature.typed_signature, confirmations=signature.confirmations,
        signed_at=signature.signed_at)


@router.get("/me/consent/signed", response_model=SignedConsentRead, responses={
    200: {"content": {"text/markdown": {}}},
    **refusals({404: "the participant has not signed a consent form yet",
                409: "the stored consent text no longer matches what was signed"})})
def signed_consent(
    session: SessionDep, participant: CurrentParticipant,
    download: Annotated[bool, Query(description="Return a Markdown file to keep")] = False,
) -> SignedConsentRead | PlainTextResponse:
    """A copy of exactly what the participant signed (the latest signature)."""
    signature, version = service.signed_consent_text(session, participant)
    copy = _signed_copy(session, participant, (signature, version))
    if not download:
        return copy
    about, language = copy.about, copy.language  # the copy is in the language it was signed in
    contacts = "".join(f"{i18n.gettext(language, label)}: {value}\n" for label, value in (
        (N_("Principal investigator"), about.principal_investigator),
        (N_("Ethics board (IRB) contact"), about.irb_contact),
        (N_("Protocol number"), about.protocol_number)) if value)
    signed = i18n.gettext(language, "Consent version %(version)s, signed as \"%(signature)s\" by participant "
                          "%(code)s on %(at)s UTC.", version=copy.version, signature=copy.typed_signature,
                          code=copy.participant_code, at=f"{copy.signed_at:%Y-%m-%d %H:%M}")
    confirmed, shown, digest = (i18n.gettext(language, label) for label in (
        N_("Confirmed"), N_("Language"), N_("SHA-256 of the consent text")))
    ticked = "".join(f"- {c['text']} ({c['id']})\n" for c in version.confirmations_in(language)
                     if c["id"] in copy.confirmations)  # each statement as it was shown
    text = (f"{about.study_title}\n\n{copy.text_markdown}\n\n---\n\n{contacts}{signed}\n{confirmed}:\n{ticked}"
            f"{shown}: {language}\n{digest}: {copy.signed_text_sha256}\n")
    return PlainTextResponse(text, media_type="text/markdown", headers={
        "Content-Disposition": f'attachment; filename="consent-{copy.version}-{copy.participant_code}.md"'})


@router.put("/me/profile", responses=refusals({
    403: "the participant withdrew, or has not signed the consent version in force (code consent_required)",
    422: "the study needs a contact email and none was given (code email_required)"}))
def update_profile(body: ProfileUpdate, session: SessionDep, participant: CurrentParticipant,
                   token: Token) -> ParticipantRead:
    """Time zone and contact email; the first time, this completes enrollment (arm assigned,
    baseline surveys assigned). Without an email address, the answer carries a return code, once."""
    scheduler_service.save_profile(session, participant, timezone=body.timezone, contact_email=body.contact_email)
    return_code = signin.ensure_return_code(session, participant)
    return _participant_read(session, participant, token).model_copy(update={"return_code": return_code})


@router.put("/me/language", responses=refusals({
    422: "the study is not offered in that language (code language_not_offered)"}))
def set_language(body: LanguageUpdate, session: SessionDep, participant: CurrentParticipant,
                 token: Token) -> ParticipantRead:
    """The language of the study's pages, emails, consent and surveys for this participant: one of the
    study's languages (the consent's ``languages``)."""
    service.set_language(session, participant, body.language)
    return _participant_read(session, participant, token)


@router.post("/me/withdrawal", responses=refusals({
    409: "the study's protocol does not allow deleting data already collected (code deletion_not_allowed)"}))
def withdraw(body: WithdrawalCreate, session: SessionDep, participant: CurrentParticipant) -> WithdrawalRead:
    """Withdraw now: stop contact (keep data) or also delete research data."""
    receipt = service.withdraw(session, participant, body.level,
                               audit.Actor("participant", participant.code))
    return WithdrawalRead(participant_code=receipt.participant_code, level=receipt.level,
                          withdrawn_at=receipt.withdrawn_at, deleted_rows=receipt.deleted_rows,
                          message=receipt.message)

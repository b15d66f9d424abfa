"""Staff exports as a download: the same exports as the CLI, zipped (``analysis.archive``).
Admins and researchers; viewers only ``format=aggregates`` (analysis.aggregates: suppressed tables).
Every export is audited, by the export itself. While the study is blinded until its analysis plan
is frozen (``analysis.plan.blinding``), the aggregates' outcome tables are pooled over the arms and
the other formats answer 409, unless an admin gives ``unblind_reason`` (audited).

The caller is checked in a unit of work of its own, committed before the export starts; the export
reads in a read-only transaction and records its audit entry in one of its own, so no transaction
of this request stays open (on SQLite, no write lock is held) while a large study is read."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool

from analysis.archive import ArchiveFormat, export_archive
from api.deps import STAFF_SIGNED_OUT, current_staff, run_unit, staff_bearer
from api.errors import DocumentedRoute, refusals, refuses
from api.routers.staff import NO_STUDY_ACCESS, staff_actor, study_access
from study import audit
from study.validation import Line

staff_router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)


@refuses({401: STAFF_SIGNED_OUT, 403: NO_STUDY_ACCESS})
async def export_caller(request: Request, slug: Line,
                        bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(staff_bearer)],
                        ) -> tuple[audit.Actor, int]:
    """The staff member asking and the study's id, once they have a role in it."""
    def check(session: Session) -> tuple[audit.Actor, int]:
        staff = current_staff(session, bearer)
        return staff_actor(staff), study_access(slug, session, staff).study.id
    return await run_unit(request, check)


@staff_router.get("/studies/{slug}/exports", response_class=FileResponse,
                  responses={200: {"content": {"application/zip": {}},
                                   "description": "the export's tables, codebook and README, zipped"},
                             **refusals({403: "a viewer may export aggregates only (code participant_data_forbidden); "
                                              "unblind_reason from anyone but an admin (code unblind_forbidden)",
                                         409: "the study is blinded until its analysis plan is frozen: every format "
                                              "but aggregates carries the arm beside outcomes (code "
                                              "blinded_until_plan_frozen)",
                                         422: "turns, shift_dates or drop_free_text with a format they do not "
                                              "apply to: trajectories, aggregates (code invalid)"})})
async def download_export(
    request: Request, caller: Annotated[tuple[audit.Actor, int], Depends(export_caller)],
    format: Annotated[ArchiveFormat, Query(
        description="csv, parquet, spss (.sav) or stata (.dta); or trajectories: outcome-labelled conversations "
                    "(JSONL) of the participants who agreed to share conversation text; or aggregates: tables "
                    "with cells under 5 participants suppressed (the only format open to viewers)")] = "csv",
    turns: Annotated[bool, Query(description="include every turn's text (scrubbed of emails and phones)")] = False,
    shift_dates: Annotated[bool, Query(description="de-identify: shift each participant's dates by a random "
                                       "offset, rename participants and ids for this export, rows in a random "
                                       "order")] = False,
    drop_free_text: Annotated[bool, Query(description="leave out free-text columns")] = False,
    unblind_reason: Annotated[Line | None, Query(
        max_length=500, description="admins, while the study is blinded until its analysis plan is frozen: why this "
                                    "export must show outcomes by arm (recorded in the audit log)")] = None,
) -> FileResponse:
    actor, study_id = caller

    def build() -> tuple[Path, Path]:
        folder = Path(tempfile.mkdtemp(prefix="afterward-export-"))
        try:
            return folder, export_archive(request.app.state.engine, actor, study_id, folder, format, turns=turns,
                                          shift_dates=shift_dates, drop_free_text=drop_free_text,
                                          unblind=unblind_reason)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    folder, archive = await run_in_threadpool(build)
    return FileResponse(archive, media_type="application/zip", filename=archive.name,
                        background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True))

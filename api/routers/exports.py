"""Staff exports as a download: the same ``analysis.exports.export_study`` as the CLI, zipped.
Admins and researchers; viewers only ``format=aggregates`` (analysis.aggregates: suppressed tables).
Every export is audited."""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from analysis.aggregates import AGGREGATES, export_aggregates
from analysis.exports import Format, export_study
from analysis.trajectories import export_trajectories
from api.deps import SessionDep
from api.errors import DocumentedRoute, refusals
from api.routers.staff import StudyAccess, staff_actor
from study import audit
from study.errors import Forbidden, Invalid

staff_router = APIRouter(prefix="/staff", tags=["staff"], route_class=DocumentedRoute)


@staff_router.get("/studies/{slug}/exports", response_class=FileResponse,
                  responses={200: {"content": {"application/zip": {}},
                                   "description": "the export's tables, codebook and README, zipped"},
                             **refusals({403: "a viewer may export aggregates only (code participant_data_forbidden)",
                                         422: "turns, shift_dates or drop_free_text with a format they do not "
                                              "apply to: trajectories, aggregates (code invalid)"})})
def download_export(
    request: Request, session: SessionDep, access: StudyAccess,
    actor: Annotated[audit.Actor, Depends(staff_actor)],
    format: Annotated[Format | Literal["trajectories", "aggregates"], Query(
        description="csv, parquet, spss (.sav) or stata (.dta); or trajectories: outcome-labelled conversations "
                    "(JSONL) of the participants who agreed to share conversation text; or aggregates: tables "
                    "with cells under 5 participants suppressed (the only format open to viewers)")] = "csv",
    turns: Annotated[bool, Query(description="include every turn's text (scrubbed of emails and phones)")] = False,
    shift_dates: Annotated[bool, Query(description="de-identify: shift each participant's dates by a random "
                                       "offset, rename participants and ids for this export, rows in a random "
                                       "order")] = False,
    drop_free_text: Annotated[bool, Query(description="leave out free-text columns")] = False,
) -> FileResponse:
    if format != AGGREGATES and not access.participant_level:
        raise Forbidden("your role in this study (viewer) may export aggregates only: ask for format=aggregates "
                        "(tables with every cell under 5 participants suppressed)", code="participant_data_forbidden")
    if format == AGGREGATES and (turns or shift_dates or drop_free_text):
        raise Invalid("turns, shift_dates and drop_free_text do not apply to the aggregates format")
    if format == "trajectories" and (turns or shift_dates or drop_free_text):
        raise Invalid("turns, shift_dates and drop_free_text do not apply to the trajectories format")
    # Authorized: end this request's transaction now, so a long export holds no lock (the export
    # reads in a read-only transaction of its own); the audit entry is written in a new one.
    session.commit()
    folder = Path(tempfile.mkdtemp(prefix="afterward-export-"))
    try:
        if format == "trajectories":
            export_trajectories(request.app.state.engine, access.study.slug, folder / "export", actor=actor,
                                audit_in=session)
        elif format == AGGREGATES:
            export_aggregates(request.app.state.engine, access.study.slug, folder / "export", actor=actor,
                              audit_in=session)
        else:
            export_study(request.app.state.engine, access.study.slug, folder / "export", format=format,
                         turns=turns, shift_dates=shift_dates, drop_free_text=drop_free_text, actor=actor,
                         audit_in=session)
        archive = folder / f"{access.study.slug}-{format}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for path in sorted((folder / "export").iterdir()):
                bundle.write(path, arcname=f"{access.study.slug}/{path.name}")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return FileResponse(archive, media_type="application/zip", filename=archive.name,
                        background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True))

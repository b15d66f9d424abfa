"""Staff exports as a download: the same ``analysis.exports.export_study`` as the CLI, zipped.
Admins and researchers only (viewers see the aggregate summary); every export is audited."""

from __future__ import annotations

import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from analysis.exports import Format, export_study
from api.deps import SessionDep
from api.routers.staff import ParticipantLevelAccess, staff_actor
from study import audit

staff_router = APIRouter(prefix="/staff", tags=["staff"])


@staff_router.get("/studies/{slug}/exports", response_class=FileResponse,
                  responses={200: {"content": {"application/zip": {}},
                                   "description": "the export's tables, codebook and README, zipped"}})
def download_export(
    request: Request, session: SessionDep, access: ParticipantLevelAccess,
    actor: Annotated[audit.Actor, Depends(staff_actor)],
    format: Annotated[Format, Query(description="csv, parquet, spss (.sav) or stata (.dta)")] = "csv",
    turns: Annotated[bool, Query(description="include every turn's text (scrubbed of emails and phones)")] = False,
    shift_dates: Annotated[bool, Query(description="shift each participant's dates by a random offset")] = False,
    drop_free_text: Annotated[bool, Query(description="leave out free-text columns")] = False,
) -> FileResponse:
    # Authorized: end this request's transaction now, so a long export holds no lock (the export
    # reads in a read-only transaction of its own); the audit entry is written in a new one.
    session.commit()
    folder = Path(tempfile.mkdtemp(prefix="afterward-export-"))
    try:
        export_study(request.app.state.engine, access.study.slug, folder / "export", format=format, turns=turns,
                     shift_dates=shift_dates, drop_free_text=drop_free_text, actor=actor, audit_in=session)
        archive = folder / f"{access.study.slug}-{format}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for path in sorted((folder / "export").iterdir()):
                bundle.write(path, arcname=f"{access.study.slug}/{path.name}")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return FileResponse(archive, media_type="application/zip", filename=archive.name,
                        background=BackgroundTask(shutil.rmtree, folder, ignore_errors=True))

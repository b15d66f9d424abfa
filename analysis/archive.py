"""A study's export as one zip archive, as staff download it (the staff API and the dashboard):
the same exports as ``afterward export`` (``analysis.exports``, ``analysis.trajectories``,
``analysis.aggregates``), each audited by the export itself (``study.export``, in a transaction
of its own, so no transaction of the caller stays open while a large study is read)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Literal, cast

from sqlalchemy.engine import Engine

from analysis.aggregates import AGGREGATES, export_aggregates
from analysis.exports import FORMATS, Format, export_study
from analysis.plan import outcome_view
from analysis.trajectories import export_trajectories
from study import audit
from study.db import session_scope
from study.errors import Forbidden, Invalid
from study.staff import staff_access

ArchiveFormat = Format | Literal["trajectories", "aggregates"]
ARCHIVE_FORMATS: tuple[str, ...] = (AGGREGATES, *FORMATS, "trajectories")


def export_archive(engine: Engine, actor: audit.Actor, study_id: int, folder: Path, export_format: str, *,
                   turns: bool = False, shift_dates: bool = False, drop_free_text: bool = False,
                   unblind: str | None = None) -> Path:
    """Export the study in ``export_format`` into ``folder`` and zip it there: the archive
    ``{slug}-{format}.zip``, the export's tables, codebook and README under ``{slug}/``. Open to
    researchers and admins of the study; viewers may export aggregates only (Forbidden
    otherwise, ``participant_data_forbidden``). ``export_format`` is one of ``ARCHIVE_FORMATS``;
    ``turns``, ``shift_dates`` and ``drop_free_text`` apply to the row-level formats only (Invalid
    otherwise). While the study is blinded until its analysis plan is frozen (``analysis.plan``) the
    aggregates' outcome tables are pooled over the arms and every other format is refused
    (``Blinded``), unless an admin gives the reason to ``unblind`` (audited). The export audits itself."""
    if export_format not in ARCHIVE_FORMATS:
        raise Invalid(f"unknown format '{export_format}'; one of {', '.join(ARCHIVE_FORMATS)}")
    with session_scope(engine, read_only=True) as session:
        access = staff_access(session, actor, study_id)
    if export_format != AGGREGATES and not access.participant_level:
        raise Forbidden("your role in this study (viewer) may export aggregates only: ask for format=aggregates "
                        "(tables with every cell under 5 participants suppressed)", code="participant_data_forbidden")
    if export_format not in FORMATS and (turns or shift_dates or drop_free_text):
        raise Invalid(f"turns, shift_dates and drop_free_text do not apply to the {export_format} format")
    slug, out = access.study.slug, folder / "export"
    if export_format == "trajectories":  # arm and outcome labels in every line
        outcome_view(engine, study_id, actor, "the trajectories export", unblind=unblind)
        export_trajectories(engine, slug, out, actor=actor)
    elif export_format == AGGREGATES:
        export_aggregates(engine, slug, out, actor=actor, unblind=unblind)
    else:
        export_study(engine, slug, out, format=cast(Format, export_format), turns=turns, shift_dates=shift_dates,
                     drop_free_text=drop_free_text, actor=actor, unblind=unblind)
    archive = folder / f"{slug}-{export_format}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted(out.iterdir()):
            bundle.write(path, arcname=f"{slug}/{path.name}")
    return archive

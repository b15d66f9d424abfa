"""The dashboard's study picker names each study by its title and its slug: two studies with the
same title (a pilot and its rerun) can be told apart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import streamlit as st
from sqlalchemy.engine import Engine

from dashboard import data
from study.models import StaffRole
from study.settings import get_settings
from tests.builders import load_study, make_staff
from tests.dashboard.test_oncall_link import also_in, signed_in

RESEARCHER = "twins@uni.example"


@pytest.fixture
def twins(engine: Engine, example_protocol: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    first = load_study(engine, example_protocol)
    second = load_study(engine, example_protocol.replace("id: wellbeing-pilot", "id: wellbeing-rerun", 1))
    make_staff(engine, first, StaffRole.RESEARCHER, RESEARCHER)
    also_in(engine, second, RESEARCHER)
    monkeypatch.setenv("AFTERWARD_DATABASE_URL", engine.url.render_as_string(hide_password=False))
    get_settings.cache_clear()
    st.cache_data.clear()
    data._generations.clear()
    yield first, second
    st.cache_data.clear()


def test_two_studies_with_one_title_are_told_apart_by_their_slugs(twins: tuple[str, str]) -> None:
    app = signed_in({}, RESEARCHER)
    picker = app.selectbox(key="afterward_study")
    labels = [str(option) for option in picker.options]
    assert len(labels) == 2
    titles = {label.split(" · ")[0] for label in labels}
    assert len(titles) == 1  # the same title...
    for slug, label in zip(sorted(twins), sorted(labels, key=lambda text: text.split(" · ")[1]), strict=True):
        assert f" · {slug} (researcher)" in label  # ...told apart by the slug

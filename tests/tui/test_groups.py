"""A dataset in the viewer: its key=value groups in the source, the ``g`` picker, and bad starts.

The datasets are the sample traces copied under ``server=a/`` and ``server=b/``; every count a
test expects comes from ``analyze_dataset`` (what ``tracetool analyze DATASET`` prints) over the
same folders, never from a number written here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import OptionList, Static
from tui_helpers import screen_text, settle, text_of
from tui_traces import bad_trace, two_servers

from analyzers.options import AnalysisOptions
from tests.conftest import run_tracetool
from tests.waiting import wait_until_async
from tracetool.errors import BadInput, UsageError
from tracetool.reader import Trace
from tracetool.trace_source import DirectorySource, GroupedSource, SourceDefaults
from tracetool.tui.app import TraceApp
from tracetool.tui.model import ALL, View, analyse
from tracetool.tui.screens.groups import GroupScreen
from tracetool.tui.screens.overview import OverviewScreen

SIZE = (120, 40)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return two_servers(tmp_path_factory.mktemp("dataset"))


@pytest.fixture(scope="module")
def by_group(dataset: Path) -> dict[str, dict[str, Any]]:
    """``analyze DATASET --json``'s document: "all" and each group's entry, by group name."""
    from analyzers.fleet import analyze_dataset

    doc = analyze_dataset([dataset]).to_json()
    out = {ALL: doc}
    for g in doc["groups"]:
        out[", ".join(f"{k}={v}" for k, v in g["group"].items())] = g
    return out


# -- the source (headless) ------------------------------------------------------------------------

def test_a_dataset_source_knows_its_groups(dataset: Path) -> None:
    src = DirectorySource([dataset])
    assert isinstance(src, GroupedSource)
    src.open()
    assert src.keys == ["server"] and src.group_by == ["server"]
    assert [(g.name, g.labels) for g in src.groups()] == [
        ("server=a", ("server=a/chat", "server=a/network")), ("server=b", ("server=b/queueing",))]
    assert src.label == "all · 3 traces" and src.describe("server=a") == "server=a · 2 traces"
    assert [lab for lab, _ in src.labelled("server=b")] == ["server=b/queueing"]
    with pytest.raises(BadInput, match="no group"):
        src.labelled("server=z")


def test_a_plain_directory_has_no_groups(traces: Path) -> None:
    src = DirectorySource([traces])
    src.open()
    assert src.groups() == [] and src.keys == [] and src.label == "2 traces"


def test_group_by_an_unknown_key_is_a_usage_error_before_reading(tmp_path: Path) -> None:
    bad_trace(tmp_path / "ds" / "server=a" / "broken")  # would be exit 3 if it were read first
    with pytest.raises(UsageError, match=r"--group-by region: no such key in the dataset \(keys: server\)"):
        DirectorySource([tmp_path / "ds"], group_by=["region"]).open()


def test_an_unreadable_trace_of_a_dataset_is_set_aside(dataset: Path, tmp_path: Path) -> None:
    ds = two_servers(tmp_path / "ds")
    bad_trace(ds / "server=b" / "broken")
    src = DirectorySource([ds])
    assert len(src.open()) == 3
    assert [p.name for p, _ in src.bad] == ["broken"]
    assert src.status() == "file · 1 unreadable trace set aside"
    assert any("broken: skipped: " in w and "tokens.arrows" in w for w in src.warnings)
    assert [g.labels for g in src.groups()][1] == ("server=b/queueing",)


def test_a_groups_snapshot_equals_analyze_on_that_group(dataset: Path, by_group: dict[str, Any]) -> None:
    snap = analyse(DirectorySource([dataset]), AnalysisOptions(), generation=1, group="server=a")
    assert snap is not None and snap.group == "server=a" and snap.source_label == "server=a · 2 traces"
    assert snap.labels == [ALL, "server=a/chat", "server=a/network"]
    doc = snap.view(ALL).doc
    want = by_group["server=a"]
    assert (doc["requests"], doc["bottleneck"], doc["headline"]) == (
        want["requests"], want["bottleneck"], want["headline"])


# -- the app --------------------------------------------------------------------------------------

def shown(app: TraceApp) -> View:
    view = app.current_view()
    assert view is not None, "nothing analysed yet"
    return view


def picker_rows(app: Any) -> dict[str, str]:
    """The picker's rows as the user reads them, by group name."""
    options = app.screen.query_one(OptionList)
    return {str(o.id): getattr(o.prompt, "plain", str(o.prompt))
            for o in (options.get_option_at_index(i) for i in range(options.option_count))}


def header(app: Any) -> str:
    return screen_text(app).splitlines()[0]


async def pick(pilot: Any, name: str) -> None:
    """Open the picker, move to ``name`` with the arrow keys, press enter, wait for the analysis."""
    await pilot.press("g")
    assert isinstance(pilot.app.screen, GroupScreen)
    options = pilot.app.screen.query_one(OptionList)
    ids = [options.get_option_at_index(i).id for i in range(options.option_count)]
    steps = ids.index(name) - (options.highlighted or 0)
    await pilot.press(*(["down"] * steps if steps > 0 else ["up"] * -steps), "enter")
    await settle(pilot)


@pytest.mark.anyio
@pytest.mark.slow
async def test_picking_a_group_shows_that_groups_traces_together(dataset: Path,
                                                                 by_group: dict[str, Any]) -> None:
    app = TraceApp(DirectorySource([dataset]))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.check_action("pick_group", ()) is True
        assert "all · 3 traces" in header(app)
        assert f"{by_group[ALL]['requests']} requests" in header(app)
        await pilot.press("g")
        assert isinstance(app.screen, GroupScreen)
        text = screen_text(app)
        # all and server=b (one trace: its own view) are analysed already; server=a is not yet
        assert "Pick a group" in text and "by server" in text
        rows = picker_rows(app)
        assert list(rows) == [ALL, "server=a", "server=b"]
        for name in (ALL, "server=b"):
            row, doc = rows[name], by_group[name]
            assert f"{doc['requests']} requests" in row and f"{doc['bottleneck']} is the bottleneck" in row, row
        row_a = rows["server=a"]
        assert "2 traces" in row_a and "not analysed yet" in row_a
        await pilot.press("escape")
        assert isinstance(app.screen, OverviewScreen) and app.group is None

        await pick(pilot, "server=a")
        want = by_group["server=a"]
        assert app.group == "server=a" and isinstance(app.screen, OverviewScreen)
        assert shown(app).doc["requests"] == want["requests"]
        text = screen_text(app)
        assert "server=a · 2 traces" in text.splitlines()[0]
        assert f"{want['requests']} requests" in text.splitlines()[0]
        assert text_of(app.screen.query_one("#headline", Static)) == want["headline"]
        # t steps through the group's traces only, then back to the group together
        seen = []
        for _ in range(3):
            await pilot.press("t")
            seen.append(shown(app).label)
        assert seen == ["server=a/chat", "server=a/network", ALL]
        await pilot.press("4")  # every screen shows the group
        await settle(pilot)
        assert "server=a · 2 traces" in header(app)
        await pilot.press("1")

        await pilot.press("g")  # the group analysed is remembered in the picker
        row_a = picker_rows(app)["server=a"]
        assert f"{want['requests']} requests" in row_a and f"{want['bottleneck']} is the bottleneck" in row_a
        await pilot.press("escape")

        await pick(pilot, ALL)
        assert app.group is None and shown(app).doc["requests"] == by_group[ALL]["requests"]
        assert "all · 3 traces" in header(app)
        await pilot.press("q")
    assert app.return_code == 0


@pytest.mark.anyio
async def test_g_is_not_offered_without_keys(traces: Path, make_app: Any) -> None:
    app = make_app(traces)
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot)
        assert app.check_action("pick_group", ()) is False
        assert "Group" not in screen_text(app).splitlines()[-1], "the footer does not offer g"
        await pilot.press("g")
        assert isinstance(app.screen, OverviewScreen)


@pytest.mark.anyio
async def test_an_unreadable_trace_is_a_notice_not_a_crash(tmp_path: Path) -> None:
    ds = two_servers(tmp_path / "ds")
    bad_trace(ds / "server=b" / "broken")
    app = TraceApp(DirectorySource([ds]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:  # run_test hides toasts by default
        await settle(pilot)
        text = screen_text(app)
        assert "1 unreadable trace set aside" in text and "skipped" in text
        assert "all · 3 traces" in text.splitlines()[0]
        await pilot.press("q")
    assert app.return_code == 0


class TwoServers(SourceDefaults):
    """A test double of a live source (tests only): two servers' windows, chat and xregion."""

    live = True
    refresh_s = 0.2
    label = "127.0.0.1:9000, 127.0.0.1:9001"

    def __init__(self, *paths: Path) -> None:
        self._traces: list[Trace] = DirectorySource(paths).open()
        self._lock = threading.Lock()

    def snapshot(self) -> list[Trace]:
        return list(self._traces)

    def status(self) -> str:
        return "connected"

    def close(self) -> None:
        pass


@pytest.mark.anyio
@pytest.mark.slow
async def test_on_a_live_source_g_picks_a_server(chat: Path, xregion: Path) -> None:
    app = TraceApp(TwoServers(chat, xregion))
    async with app.run_test(size=SIZE) as pilot:
        await wait_until_async(lambda: app.snapshot is not None, "the live source's first snapshot", pilot=pilot)
        assert app.check_action("pick_group", ()) is True
        await pilot.press("g")
        assert isinstance(app.screen, GroupScreen)
        ids = [app.screen.query_one(OptionList).get_option_at_index(i).id
               for i in range(app.screen.query_one(OptionList).option_count)]
        assert ids == [ALL, "chat", "xregion"]
        await pilot.press("down", "down", "enter")
        assert app.selected == "xregion"
        await wait_until_async(lambda: app.current_view() is not None and shown(app).label == "xregion",
                               "the xregion server's analysis on screen", pilot=pilot)
        assert shown(app).doc["bottleneck"] == "network"
        await pilot.press("q")


# -- the command line -----------------------------------------------------------------------------

def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("tracetool: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_unknown_group_by_key_is_one_line_and_exit_2(dataset: Path) -> None:
    r = run_tracetool("tui", dataset, "--group-by", "region")
    assert r.returncode == 2
    assert "--group-by region: no such key in the dataset (keys: server)" in _one_error_line(r.stderr)


def test_a_dataset_of_unreadable_traces_is_one_line_and_exit_3(tmp_path: Path) -> None:
    bad_trace(tmp_path / "ds" / "server=a" / "one")
    bad_trace(tmp_path / "ds" / "server=b" / "two")
    r = run_tracetool("tui", tmp_path / "ds")
    assert r.returncode == 3 and "no readable trace among 2" in _one_error_line(r.stderr)


def test_a_dataset_with_one_unreadable_trace_warns_and_goes_on(tmp_path: Path) -> None:
    ds = two_servers(tmp_path / "ds")
    bad_trace(ds / "server=b" / "broken")
    r = run_tracetool("tui", ds)  # no terminal: it stops there, after reading the dataset
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2 and "needs an interactive terminal" in lines[-1]
    assert any("broken: skipped: " in ln for ln in lines[:-1]) and "Traceback" not in r.stderr


@pytest.mark.anyio
async def test_a_model_key_the_analysis_does_not_use_is_a_notice(tmp_path: Path, chat: Path) -> None:
    """The analysis's own warnings (a meta.json model block's keys not used) reach the viewer as
    ``analyze`` prints them on stderr, not only the readers'."""
    import json
    import shutil

    trace = tmp_path / "typo"
    shutil.copytree(chat, trace)
    meta = json.loads((trace / "meta.json").read_text())
    meta["model"] = {**(meta.get("model") or {}), "num_key_value_headz": 4}
    (trace / "meta.json").write_text(json.dumps(meta))
    app = TraceApp(DirectorySource([trace]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await settle(pilot)
        text = screen_text(app)
        assert "num_key_value_headz" in text and "not used" in text
        await pilot.press("q")
    assert app.return_code == 0

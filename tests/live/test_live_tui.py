"""The viewer on a live source: two servers side by side and combined, a header that moves with each refresh,
the window key, and a server that goes away shown as disconnected."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from live_helpers import Traffic, wait_until

from collectors.recorder import Recorder
from tests.waiting import wait_until_async
from tracetool.live.client import ClientOptions
from tracetool.live.source import LiveSource

pytestmark = pytest.mark.slow


def test_source_gives_each_server_and_status(live_recorder: Callable[..., Recorder]) -> None:
    import analyzers

    a, b = live_recorder("a"), live_recorder("b")
    src = LiveSource([a.live.address, b.live.address], options=ClientOptions(backoff_s=0.1)).start()
    try:
        with Traffic(a, prefix="a"), Traffic(b, prefix="b"):
            wait_until(lambda: len(src.snapshot()) == 2, "both servers' windows")
        traces = src.snapshot()
        assert [t.name for t in traces] == [str(a.live.address), str(b.live.address)]
        analysis = analyzers.analyze(traces)
        doc = analysis.to_json()
        assert [t["trace"] for t in doc["traces"]] == [str(a.live.address), str(b.live.address)]
        assert doc["requests"] == sum(t["requests"] for t in doc["traces"])
        status = src.status()
        assert status.count("connected") == 2 and "tokens" in status and "window last 30 s" in status
        b.close()
        wait_until(lambda: "disconnected" in src.status(), "server b shown as disconnected")
        assert src.status().split(" │ ")[0].startswith(f"{a.live.address}: connected")
    finally:
        src.close()


@pytest.mark.anyio  # anyio's pytest plugin (anyio comes with httpx) runs the async test
async def test_app_header_moves_with_each_refresh_and_w_slides(live_recorder: Callable[..., Recorder]) -> None:
    from tracetool.tui.app import TraceApp

    rec = live_recorder()
    src = LiveSource([rec.live.address], refresh_s=0.25)
    app = TraceApp(src)
    try:
        with Traffic(rec):
            async with app.run_test(size=(120, 40)) as pilot:
                seen: list[str] = []

                def moved() -> bool:  # each refresh's status line (tokens received) differs from the last
                    if not seen or app.status_line != seen[-1]:
                        seen.append(app.status_line)
                    return len(seen) >= 6

                await wait_until_async(moved, "the header to move five times", pilot=pilot)
                assert all("connected" in s for s in seen[1:])
                await wait_until_async(lambda: app.snapshot is not None, "the first snapshot", pilot=pilot)
                assert app.snapshot.views and app.snapshot.source_label == str(rec.live.address)
                # the ticks after the first swap the data into a kept connection (tui.model.Sessions)
                assert app._sessions is not None
                sessions = app._sessions
                await wait_until_async(lambda: sessions.reused >= 2, "two ticks on a kept connection", pilot=pilot)
                assert app.check_action("window", ())
                await pilot.press("w")
                assert src.spec.seconds == 60.0 and "window last 60 s" in app.status_line
                await pilot.press("q")
        assert app.return_code == 0
    finally:
        src.close()


@pytest.mark.anyio
async def test_app_analyses_the_view_shown_and_t_switches_servers(live_recorder: Callable[..., Recorder]) -> None:
    """A live tick analyses only the view on screen; t moves to the next server and analyses it."""
    from tracetool.tui.app import TraceApp
    from tracetool.tui.model import ALL

    a, b = live_recorder("a"), live_recorder("b")
    src = LiveSource([a.live.address, b.live.address], options=ClientOptions(backoff_s=0.1))
    app = TraceApp(src)
    names = [ALL, str(a.live.address), str(b.live.address)]
    try:
        with Traffic(a, prefix="a"), Traffic(b, prefix="b"):
            async with app.run_test(size=(120, 40)) as pilot:
                async def shown(label: str) -> None:
                    def alone() -> bool:
                        snap = app.snapshot
                        return snap is not None and snap.labels == names and list(snap.views) == [label]

                    await wait_until_async(alone, f"{label} analysed alone", pilot=pilot)

                await shown(ALL)  # the combined view first, alone
                assert "view all (2 traces, t)" in app.screen.query_one("StatusBar").render().plain
                for label in [*names[1:], ALL]:
                    await pilot.press("t")
                    assert app.selected == label
                    await shown(label)
                    assert app.current_view() is not None and app.current_view().label == label
                await pilot.press("q")
        assert app.return_code == 0
    finally:
        src.close()

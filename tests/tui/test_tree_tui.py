"""What the chat app shows for draft trees: a count of rounds won by a branch other than the
first-ranked path (on the scripted fake engine, which reports tree rounds under --tree)."""

from __future__ import annotations

from pathlib import Path

from edgespec.tui.app import ChatApp
from edgespec.tui.fake import FakeScript
from edgespec.tui.part import TextLines
from edgespec.tui.store import ChatStore
from edgespec.tui.widgets import StatsPanel, StatsView, TurnMeter, stats_table

from edgespec.config import GenerationConfig, SamplingConfig, SpecConfig
from edgespec.events import Round
from tests.helpers.tui import FakeLoader, ask, run, wait_for


def test_the_meter_counts_rounds_won_by_another_branch():
    meter = TurnMeter(started=0.0)
    rounds = [
        Round(0, 7, 2, 4, 0.01, 0.02, "tree", nodes=7, branch=0),
        Round(1, 7, 1, 4, 0.01, 0.02, "tree", nodes=7, branch=2),
        Round(2, 4, 0, 4, 0.01, 0.02, "draft"),  # a chain round
    ]
    meter.add([], rounds, 1.0)
    view = StatsView(k=4, temperature=0.0, spec_on=True).with_meter(meter)
    assert "Other branch 1 of 2 rounds" in stats_table(view).plain
    chains = StatsView(k=4, temperature=0.0, spec_on=True)
    assert "Other branch" not in stats_table(chains).plain  # no row without tree rounds


def test_the_stats_panel_shows_branch_wins_after_a_tree_answer(tmp_path: Path):
    loader = FakeLoader(FakeScript(answer_tokens=30))
    config = GenerationConfig(
        SamplingConfig(), SpecConfig(k=4, tree="3,2,1,1", method="draft"), max_tokens=64
    )
    app = ChatApp(loader, config, ChatStore(tmp_path / "chats"), what="fake pair")

    async def scenario() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.ready)
            await ask(pilot, app, "hello")
            table = str(app.query_one(StatsPanel).query_one("#table", TextLines).render())
            rounds = int(table.split("Rounds")[1].split()[0])
            assert f"Other branch {rounds // 3 + (rounds % 3 > 1)} of {rounds} rounds" in table

    run(scenario)

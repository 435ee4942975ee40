"""The chat app's settings keys: speculation on and off, K (fixed or adaptive), the
temperature and the chat template's thinking mode. Each applies from the next answer; the stats
panel (the header, for thinking) shows the new settings at once."""

from __future__ import annotations

from collections.abc import Callable

from edgespec.tui import settings
from edgespec.tui.answer_actions import AnswerActions
from edgespec.tui.widgets import StatsView

from edgespec.config import GenerationConfig


class SettingActions(AnswerActions):
    """The settings actions; `ChatApp` subclasses it and lists their bindings."""

    config: GenerationConfig
    has_draft: bool
    engine_name: str
    think: bool | None  # the template's thinking mode for the next turn; None: it has none
    _asked_think: bool | None  # --think / --no-think
    _spec_method: str  # the method speculation turns back on with
    _last_view: StatsView | None
    _show_stats: Callable[[], None]  # ChatApp's: redraw the stats panel

    def action_toggle_spec(self) -> None:
        """Speculation off/on (applies from the next turn); plain turns measure the baseline."""
        if not self.has_draft and not self.config.spec.enabled:
            self.notify("This engine has no draft model: speculation is unavailable.")
            return
        method = "none" if self.config.spec.enabled else self._spec_method
        self.config = settings.with_method(self.config, method)
        state = "on" if self.config.spec.enabled else "off (plain decoding)"
        self.notify(f"Speculation {state} from the next answer")
        self._show_stats()

    def _ready_thinking(self, thinking: bool | None) -> None:
        """The engine loaded; `thinking` is its template's default mode (None: no such mode).
        An explicit --think / --no-think replaces it, or, where the template has no thinking
        mode, is said once to change nothing."""
        asked = self._asked_think
        self.think = thinking if asked is None or thinking is None else asked
        if asked is not None and thinking is None:
            flag = "--think" if asked else "--no-think"
            self.notify(
                f"The chat template of {self.engine_name} has no thinking mode; {flag} "
                "changes nothing."
            )
        self._show_thinking()

    def _show_thinking(self) -> None:
        """The header's subtitle: the pair, and the thinking mode where the template has one."""
        mode = "" if self.think is None else f" · thinking {'on' if self.think else 'off'}"
        if getattr(
            self, "base_model", False
        ):  # no chat template, or its answers look like nonsense
            mode += " · base model: it continues your text (no chat template)"
        self.sub_title = f"{self.engine_name}{mode}"  # type: ignore[attr-defined]

    def action_toggle_think(self) -> None:
        """Thinking on/off (from the next answer): the chat template's enable_thinking."""
        if self.think is None:
            self.notify(f"The chat template of {self.engine_name} has no thinking mode.")
            return
        self.think = not self.think
        self.notify(f"Thinking {'on' if self.think else 'off'} from the next answer")
        self._show_thinking()

    def _set_k(self, k: int) -> None:
        """A K key fixes K (adaptive K off): starting from the K shown, the latest choice when
        adaptive K was on."""
        was_adaptive = self.config.spec.adaptive
        self.config = settings.with_k(self.config, k)
        if was_adaptive:
            self.notify(
                f"K fixed at {self.config.spec.k} from the next answer (F6: back to auto K)"
            )
        self._show_stats()

    def _k_base(self) -> int:
        """The K the K keys step from: the fixed K, or adaptive K's latest choice (if any)."""
        if self.config.spec.adaptive and self._last_view is not None:
            if self._last_view.k_now is not None:
                return self._last_view.k_now
        return self.config.spec.k

    def action_k_up(self) -> None:
        """Draft one more token per round (from the next turn)."""
        self._set_k(self._k_base() + 1)

    def action_k_down(self) -> None:
        """Draft one token fewer per round (from the next turn)."""
        self._set_k(self._k_base() - 1)

    def action_toggle_adaptive(self) -> None:
        """Adaptive K on/off (from the next turn): K chosen each round from the measured costs."""
        self.config = settings.with_adaptive(self.config, not self.config.spec.adaptive)
        spec = self.config.spec
        state = "auto (chosen each round)" if spec.adaptive else f"fixed at {spec.k}"
        self.notify(f"K {state} from the next answer")
        self._show_stats()

    def _set_temp(self, t: float) -> None:
        self.config = settings.with_temperature(self.config, t)
        self._show_stats()

    def action_temp_up(self) -> None:
        """Raise the temperature by 0.1 (0 = greedy)."""
        self._set_temp(self.config.sampling.temperature + settings.TEMP_STEP)

    def action_temp_down(self) -> None:
        """Lower the temperature by 0.1 (0 = greedy)."""
        self._set_temp(self.config.sampling.temperature - settings.TEMP_STEP)

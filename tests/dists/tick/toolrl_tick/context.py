"""Tick's context policy, written against the public API only (``toolrl.context``): past its trigger,
every tool result but the newest becomes a one-word stub."""

from toolrl.context import ContextPlan, ContextView, TriggeredOptions, TriggeredPolicy


class TickForget(TriggeredPolicy):
    name = "tick_forget"
    Options = TriggeredOptions

    def edit(self, view: ContextView) -> ContextPlan | None:
        tools = [i for i in range(view.task, len(view.messages)) if view.messages[i].get("role") == "tool"]
        removed = [i for i in tools[:-1] if view.messages[i].get("content") != "(forgotten)"]
        if not removed:
            return None
        messages = [dict(m, content="(forgotten)") if i in removed else m for i, m in enumerate(view.messages)]
        return ContextPlan("tick_forget", removed, messages=messages)

"""Least slack first with true output lengths: how far ``slack`` is from a perfect predictor."""

from __future__ import annotations

from sluicegate.core.entry import Entry
from sluicegate.core.policies.policy import Ordering


class SlackOracleOrdering(Ordering):
    """Like ``slack`` but with the true output length (known only in simulation).

    The gap between ``slack`` and ``slack-oracle`` is what a better output-length
    predictor could still win. Falls back to the prediction without a true length.
    """

    name = "slack-oracle"
    simulation_only = True

    def key(self, entry: Entry) -> tuple[float, ...]:
        """(deadline − true service time, priority)."""
        true_tokens = entry.ticket.true_output_tokens
        tokens = entry.predicted_output_tokens if true_tokens is None else true_tokens
        service_s = entry.prefill_s + tokens * entry.decode_s_per_token
        return (entry.deadline - service_s, entry.ticket.priority)

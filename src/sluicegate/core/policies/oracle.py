"""Shortest true job first: the bound no output-length predictor can beat."""

from __future__ import annotations

from sluicegate.core.entry import Entry
from sluicegate.core.policies.policy import Ordering


class OracleOrdering(Ordering):
    """Like ``sjf`` but with the true output length (known only in simulation).

    Falls back to the prediction for tickets without ``true_output_tokens``.
    """

    name = "oracle"
    simulation_only = True

    def key(self, entry: Entry) -> tuple[float, ...]:
        """True service time plus aging times arrival."""
        true_tokens = entry.ticket.true_output_tokens
        tokens = entry.predicted_output_tokens if true_tokens is None else true_tokens
        return (
            entry.prefill_s + tokens * entry.decode_s_per_token + self.aging * entry.ticket.arrival,
        )

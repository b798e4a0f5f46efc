"""Per-tenant shares of a lane's running slots, for lanes with ``vtc`` fairness (DESIGN §6, §7).

Fair ordering of the queue alone does not share the engine: a burst admitted
while the other tenants were idle keeps its slots, and a tenant that arrives
later waits for them to finish. So each *active* tenant of a ``vtc`` lane
(running in it, or at the head of its queue) is owed a weighted share of the
lane's slots, ``slots × w_t / Σ_active w``, with ``slots`` the lane's cap
bounded by the model's effective cap. Shares are work-conserving: a tenant may
run above its share while no tenant under its share waits. A freed slot goes
to a waiting tenant under its share before one at its share (``admission``);
and when the lane's waiting head belongs to a tenant under its share and cannot
be admitted, ``preemption.preempt_for_blocked`` stops the newest ticket of the
tenant most over its share (when the victim's lane ``preemptible`` allows it),
so the slot goes back at once.

Only slots are shared, not the model's in-flight token budget: the budget is a
KV-cache safety bound the engine rarely reaches (§5), and a victim is only
chosen when its release also makes the head fit that budget.
"""

from __future__ import annotations

from collections.abc import Mapping


class TenantSlots:
    """Running tickets per tenant in one lane, and the weight of the running tenants.

    Attributes:
        running: running tickets (own or borrowed slots) per tenant; tenants with
            none are removed, so the mapping is empty when the lane is idle.
        running_weight: the sum of the weights of the tenants in ``running``.
    """

    __slots__ = ("_max_weight", "_weights", "running", "running_weight")

    def __init__(self, weights: Mapping[str, float]) -> None:
        self._weights = weights
        self._max_weight = max(1.0, *weights.values()) if weights else 1.0
        self.running: dict[str, int] = {}
        self.running_weight = 0.0

    def weight(self, tenant: str) -> float:
        """The tenant's configured weight (1 for a tenant the config does not name)."""
        return self._weights.get(tenant, 1.0)

    def add(self, tenant: str, units: int = 1) -> None:
        """``units`` more running units (one ticket's) of ``tenant``."""
        count = self.running.get(tenant, 0)
        if count == 0:
            self.running_weight += self.weight(tenant)
        self.running[tenant] = count + units

    def remove(self, tenant: str, units: int = 1) -> None:
        """``units`` running units (one ticket's) of ``tenant`` fewer."""
        count = self.running[tenant] - units
        if count == 0:
            del self.running[tenant]
            self.running_weight -= self.weight(tenant)
            if not self.running:
                # Reset, so float drift cannot accumulate over idle periods.
                self.running_weight = 0.0
        else:
            self.running[tenant] = count

    def may_be_at_share(self, tenant: str, slots: int) -> bool:
        """Whether ``tenant`` could run its share of ``slots`` with some other tenant active:
        a cheap necessary condition for ``at_share`` (with the heaviest weight any tenant
        may have), so admission looks for another tenant only when it can matter."""
        count = self.running.get(tenant, 0)
        if not count:
            return False
        total = self.running_weight + self._max_weight
        return count * total >= slots * self.weight(tenant)

    def at_share(self, tenant: str, waiting: str, slots: int) -> bool:
        """Whether ``tenant`` already runs its share of ``slots`` while ``waiting`` is active.

        The active tenants are the running ones plus ``tenant`` and ``waiting``.
        """
        total = self.running_weight
        for name in (tenant, waiting):
            if name not in self.running:
                total += self.weight(name)
        return self.running.get(tenant, 0) * total >= slots * self.weight(tenant)

    def under_share(self, tenant: str, slots: int) -> bool:
        """Whether ``tenant``, waiting, may take one more slot and stay within its share.

        The active tenants are the running ones plus ``tenant`` itself; the share
        is ``slots × w / Σ_active w``, and ``running + 1 ≤ share`` is asked, so a
        slot taken for it never puts it above its share (no ping-pong).
        """
        count = self.running.get(tenant, 0)
        weight = self.weight(tenant)
        total = self.running_weight if count else self.running_weight + weight
        return (count + 1) * total <= slots * weight

    def over_share(self, tenant: str, waiting: str, slots: int) -> float:
        """How far ``tenant`` runs above its share of ``slots`` while ``waiting`` is active.

        Returns ``running / share`` when ``tenant`` would still hold at least its
        share after giving one slot back (``running − 1 ≥ share``), else 0.0: it
        keeps its tickets. The larger the value, the further over its share.
        """
        count = self.running.get(tenant, 0)
        total = self.running_weight
        if waiting not in self.running:
            total += self.weight(waiting)
        share = slots * self.weight(tenant) / total
        return count / share if count - 1 >= share else 0.0

"""``sluicegate demo``: emulated engines, a plain pass-through and the gateway under live load."""

"""Commands that talk to a running gateway over HTTP: ``sluicegate batch``, ``sluicegate drain``."""

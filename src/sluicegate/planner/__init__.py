"""``sluicegate plan``: capacity planning from queueing formulas (replicas, queue cap, timeout,
warm buffer, KEDA thresholds) and its tables and plot. Imports nothing of the gateway.
"""

-- No ARGV. The ids of the replicas whose liveness has not expired.
return live_replicas(now_ms())

"""Liveness: the heartbeat, the reaper, hand-backs, the engine-death exit and the sweeps of
stranded messages. Works over the job store and the running jobs' view the runtime gives it; it
never imports the job path."""

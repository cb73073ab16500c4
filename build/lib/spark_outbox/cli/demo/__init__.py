"""``outbox demo``: the whole pipeline end to end on this machine, one role per module.

procs (child processes), receivers (the reference receivers), database (a fresh
demo database), stages (generate, Spark batch and stream, dispatch), crash
(kill -9 and restart), report (numbers read back), serve (API and token),
run (the order of it all).
"""

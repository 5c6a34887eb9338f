"""Scale-out executors: the expensive half of the pipeline (plan lease -> step env -> render -> encode) in
worker processes on this machine (``process``) or Ray actors across machines (``ray``).

- :mod:`.config`: the executor choice and its limits, and the errors a user can get;
- :mod:`.episode_worker`: the worker side (env, executor, per-attempt camera encoders) emitting bounded pieces;
- :mod:`.driver`: the driver side: leases episodes from the planner, feeds pieces into the write stage and
  re-runs the attempts of a lost worker;
- :mod:`.process_backend` / :mod:`.process_main`: worker processes over a socket pair;
- :mod:`.ray_backend`: Ray actors with streaming generators; :mod:`.ray_auth`: joining a cluster with token
  authentication or without, as the cluster requires.

The write -> commit half, the store and its guarantees are the same for every executor.
"""
